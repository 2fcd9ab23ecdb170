"""Where a collective's codec work runs: on the host (NumPy bytes) or on the tensor's GPU (device streams).

The algorithms in ``ops.py`` are written once over payloads (1-D uint8 tensors) and call an
engine to encode, add homomorphically and decode; both engines give the same bytes, so a ring
over CUDA tensors and one over CPU tensors produce identical results.  ``engine_for(tensor)``
picks the device engine for CUDA tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import cuda
from . import gpu
from .codecs import ErrorBounded, Lossless, _to_float64, predicts_rows
from .homomorphic import add as host_add


def _u8(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def _bytes(p: torch.Tensor) -> bytes:
    return p.cpu().numpy().tobytes()


def _encode_args(codec, row: int) -> dict:
    """Keyword arguments of the codec's encode: lorenzo2d's row length (flat chunks carry no shape)."""
    return {"row": row} if predicts_rows(codec) else {}


class HostEngine:
    """NumPy codecs; payloads are CPU tensors.  ``row``: 2-D prediction's row length (else 0)."""

    device = torch.device("cpu")

    def __init__(self, codec, row: int = 0):
        self.codec, self.kwargs = codec, _encode_args(codec, row)

    def encode_many(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [_u8(self.codec.encode(t.reshape(-1), **self.kwargs)) for t in tensors]

    def add(self, a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
        return _u8(host_add(_bytes(a), _bytes(b), self.codec))

    def values(self, p: torch.Tensor, n: int, name: str) -> torch.Tensor:
        """float64 values of a payload (error-bounded: the exact 2 eb q)."""
        if isinstance(self.codec, ErrorBounded):
            return torch.from_numpy(self.codec.decode(_bytes(p), exact=True))
        return torch.from_numpy(np.ascontiguousarray(_to_float64(self.codec.decode(_bytes(p)), name)))


class DeviceEngine:
    """GPU codecs (``gpu.py``); payloads are CUDA tensors viewing cupy buffers, or the reverse."""

    def __init__(self, codec, device: torch.device, row: int = 0):
        self.codec, self.device, self.kwargs = codec, device, _encode_args(codec, row)
        self._streams: list[torch.cuda.Stream] = []  # encode_many's side streams, made once (a plan's engine lives long)

    def _stream_of(self, p: torch.Tensor, n: int):
        """A received payload as a DeviceStream: its size is known on the host, so no device size word."""
        with gpu.torch_stream() as cp:
            return gpu.DeviceStream(cp.asarray(p), None, n, known=p.numel())

    def _launch(self, t: torch.Tensor):
        """A DeviceStream (error-bounded) or a device buffer (lossless); no size read yet."""
        return self.codec.encode_device(t, **self.kwargs)[0]

    def _payload(self, enc) -> torch.Tensor:
        with gpu.torch_stream():
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
        with torch.cuda.stream(main):  # main (and its device) now follows every encoder
            gpu.read_sizes([e for e in encoded if isinstance(e, gpu.DeviceStream)])
        out = []
        for s, e in zip(streams, encoded):
            with torch.cuda.stream(s):
                p = self._payload(e)
            p.record_stream(main)
            out.append(p)
            main.wait_stream(s)
        return out

    def add(self, a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
        return self._payload(gpu.add(self._stream_of(a.to(self.device), n), self._stream_of(b.to(self.device), n)))

    def values(self, p: torch.Tensor, n: int, name: str) -> torch.Tensor:
        p = p.to(self.device)
        with gpu.torch_stream():
            if isinstance(self.codec, ErrorBounded):
                v = self.codec.decode_device(self._stream_of(p, n), **self.kwargs)
            else:
                v = self.codec.decode_device(cuda.as_cupy(p), n, name)
            return torch.as_tensor(v, device=self.device)


def engine_for(tensor: torch.Tensor, codec: ErrorBounded | Lossless, row: int = 0):
    return DeviceEngine(codec, tensor.device, row) if tensor.is_cuda else HostEngine(codec, row)
