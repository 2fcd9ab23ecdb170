"""Where a collective's codec work runs: on the host (NumPy bytes) or on the tensor's GPU (device streams).

The algorithms in ``ops.py`` are written once over payloads (1-D uint8 tensors) and call an
engine to encode, add homomorphically and decode; both engines give the same bytes, so a ring
over CUDA tensors and one over CPU tensors produce identical results.  Both engines' sums are
``transport.Lazy`` payloads whose words (byte count, reports) go with them (the device engine's
still on the GPU, read by the transport with what it receives): a sum that leaves int32 is reported
in those words, not raised where it happens, so the report travels on with the sums to every rank
(``settle_carried``) instead of stopping one rank while its peers wait.  Every payload an engine
takes may be lazy.  ``engine_for(tensor)`` picks the device engine for CUDA tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import cuda, defaults
from ..errors import LimitExceededError
from ..floats import ErrorBounded, Lossless, gpu
from ..floats.dtypes import to_float64
from ..floats.error_bounded import predicts_rows
from ..floats.homomorphic import add as host_add
from . import transport as T


def _u8(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def _bytes(p: torch.Tensor) -> bytes:
    return p.cpu().numpy().tobytes()


def settle_carried(words: list[int]) -> int:
    """What a sum's words [byte count, reports] say, raised as this rank's own sum would raise them: the
    reports of a sum made on this rank, or carried to it with exact bytes from a peer (``block_add``'s
    bits, which the host engine's sums report alike: bit 64, the sum leaves int32)."""
    return gpu.settle_add(words, words[0] & 0xFFFFFFFFFFFFFFFF)


def _carried(p) -> tuple[bytes, int]:
    """A payload's exact bytes and the report bits it carries: a lazy one's (a sum of this rank's, or
    one a peer sent with reports) without raising them; an exact one's are 0."""
    if not isinstance(p, T.Lazy):
        return _bytes(p), 0
    words = p.read if p.read is not None else p.words.tolist()
    return _bytes(p.data[: p.n if p.n is not None else words[0]]), words[1]


def _encode_args(codec, row: int) -> dict:
    """Keyword arguments of the codec's encode: lorenzo2d's row length (flat chunks carry no shape)."""
    return {"row": row} if predicts_rows(codec) else {}


class HostEngine:
    """NumPy codecs; payloads are CPU tensors.  ``row``: 2-D prediction's row length (else 0)."""

    device = torch.device("cpu")
    settle_carried = staticmethod(settle_carried)

    def __init__(self, codec, row: int = 0):
        self.codec, self.kwargs = codec, _encode_args(codec, row)

    def encode_many(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [_u8(self.codec.encode(t.reshape(-1), **self.kwargs)) for t in tensors]

    def add(self, a, b, n: int) -> T.Lazy:
        """The homomorphic sum, lazy as the device engine's: its words are [byte count, reports].  A sum that
        leaves int32 reports it (``gpu.SUM_LEAVES_INT32``, with ``a``'s stream standing in for the sum no
        rank will decode) and an input's reports carry on, raised where the sum is read (``all_sizes``,
        ``transport.exact``: on every rank the reports reach) instead of here, on this rank alone."""
        (ra, wa), (rb, wb) = _carried(a), _carried(b)
        reports = wa | wb
        try:
            s = host_add(ra, rb, self.codec)
        except LimitExceededError:
            s, reports = ra, reports | gpu.SUM_LEAVES_INT32
        data = _u8(s)
        return T.Lazy(data, torch.tensor([data.numel(), reports], dtype=torch.int64), settle_carried)

    def values(self, p, n: int, name: str) -> torch.Tensor:
        """float64 values of a payload (error-bounded: the exact 2 eb q)."""
        raw = _bytes(T.exact(p))
        if isinstance(self.codec, ErrorBounded):
            return torch.from_numpy(self.codec.decode(raw, exact=True))
        return torch.from_numpy(np.ascontiguousarray(to_float64(self.codec.decode(raw), name)))

    def values_many(self, payloads: list, sizes: list[int], name: str) -> list[torch.Tensor]:
        return [self.values(p, n, name) for p, n in zip(payloads, sizes)]

    def inband(self, n_out: int, n_in: int, largest: int) -> None:
        """Host payloads' sizes cost no device read: always sized exchanges."""
        return None


class DeviceEngine:
    """GPU codecs (``floats/gpu.py``); payloads are CUDA tensors viewing cupy buffers, or the reverse."""

    def __init__(self, codec, device: torch.device, row: int = 0):
        self.codec, self.device, self.kwargs = codec, device, _encode_args(codec, row)
        # encode_many's side streams, made once (a plan's engine lives long)
        self._streams: list[torch.cuda.Stream] = []

    def inband(self, n_out: int, n_in: int, largest: int) -> T.InBand | None:
        """In-band lengths (``transport.InBand``) for a step sending an error-bounded chunk of ``n_out`` values
        and receiving one of ``n_in``, when the ``largest`` chunk of the collective has a worst-case stream
        within ``VISEMZ_COLLECTIVE_INBAND_KIB`` (every rank decides alike for every step: the chunks' sizes
        are the same everywhere): a ring or doubling step then reads nothing on the host."""
        if not isinstance(self.codec, ErrorBounded) or gpu.room(largest) > defaults.get("collective_inband_kib") * 1024:
            return None
        room_in = gpu.room(n_in)
        return T.InBand(gpu.room(n_out), room_in, lambda words: gpu.settle_add(words, room_in))

    settle_carried = staticmethod(settle_carried)

    def _stream_of(self, p, n: int, unread: bool = False):
        """A payload as a DeviceStream, its size known on the host (a lazy one's read now if not yet, raising
        its reports), or with ``unread`` a lazy one as it is, read or not (its words on the device, which
        ``gpu.add`` takes its length from and carries its reports on from)."""
        if unread and isinstance(p, T.Lazy):
            with cuda.torch_stream() as cp:
                words = cp.asarray(p.words.to(self.device)).view(cp.uint64)
                return gpu.add_input(cp.asarray(p.data.to(self.device)), words, n)
        p = T.exact(p).to(self.device)
        with cuda.torch_stream() as cp:
            return gpu.DeviceStream(cp.asarray(p), None, n, known=p.numel())

    def _launch(self, t: torch.Tensor):
        """A DeviceStream (error-bounded) or a device buffer (lossless); no size read yet."""
        return self.codec.encode_device(t, **self.kwargs)[0]

    def _payload(self, enc) -> torch.Tensor:
        with cuda.torch_stream():
            raw = enc.bytes_view() if isinstance(enc, gpu.DeviceStream) else enc
            return torch.as_tensor(raw, device=self.device)

    def encode_many(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each tensor on its own CUDA stream; once all are launched, their sizes in one host read."""
        main = torch.cuda.current_stream(self.device)
        if len(tensors) == 1:
            return [self._payload(self._launch(tensors[0]))]
        while len(self._streams) < len(tensors):
            self._streams.append(torch.cuda.Stream(self.device))
        streams = self._streams[: len(tensors)]
        encoded = []
        for s, t in zip(streams, tensors):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                encoded.append(self._launch(t))
        for s in streams:
            main.wait_stream(s)
        # main (and its device) now follows every encoder.  The payloads' memory is cupy's, from the
        # side streams' pools: a side stream reuses it only after its next wait_stream(main) above
        with torch.cuda.stream(main):
            gpu.read_sizes([e for e in encoded if isinstance(e, gpu.DeviceStream)])
            return [self._payload(e) for e in encoded]

    def add(self, a, b, n: int) -> T.Lazy:
        """The homomorphic sum, lazy: its size and error word stay on the GPU until the transport
        reads them with the words it receives, or sends them in-band.  No host read here: a lazy input's
        length goes to the kernel from device memory, and its reports into the sum's."""
        s = gpu.add(self._stream_of(a, n, unread=True), self._stream_of(b, n, unread=True), lazy=True)
        with cuda.torch_stream() as cp:
            data = torch.as_tensor(s.data, device=self.device)
            words = torch.as_tensor(s.cells.view(cp.int64), device=self.device)
        return T.Lazy(data, words, s.checked)

    def values(self, p, n: int, name: str) -> torch.Tensor:
        return self.values_many([p], [n], name)[0]

    def values_many(self, payloads: list, sizes: list[int], name: str) -> list[torch.Tensor]:
        """float64 values of each payload; error-bounded: every decoder queued, then one host read
        of all their error words."""
        if isinstance(self.codec, ErrorBounded):
            streams = [self._stream_of(p, n) for p, n in zip(payloads, sizes)]
            with cuda.torch_stream():
                return [torch.as_tensor(v, device=self.device)
                        for v in self.codec.decode_device_many(streams, **self.kwargs)]
        out = []
        for p, n in zip(payloads, sizes):
            p = T.exact(p).to(self.device)
            with cuda.torch_stream():
                out.append(torch.as_tensor(self.codec.decode_device(cuda.as_cupy(p), n, name), device=self.device))
        return out


def engine_for(tensor: torch.Tensor, codec: ErrorBounded | Lossless, row: int = 0):
    return DeviceEngine(codec, tensor.device, row) if tensor.is_cuda else HostEngine(codec, row)
