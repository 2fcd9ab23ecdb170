"""Moving compressed payloads between ranks with torch.distributed (NCCL or Gloo carry every byte).

Payloads are 1-D uint8 tensors, or ``Lazy`` ones: homomorphic sums with their words (byte count,
reports) beside them, on the GPU still in device memory.  An exchange sends sizes before payloads (unless every side
already knows them, e.g. from ``all_sizes``), so receivers allocate exactly what arrives; a lazy
payload's size word goes out straight from device memory and, on an NCCL group, the host reads it
together with the incoming sizes, one read for both (a Gloo group copies it to the host to send it).
Tensors travel on the group's own device: CUDA for NCCL (compressed bytes never visit the
host; only the int64 size words are read back), the CPU for Gloo.  Received payloads come back
on that device; callers move them where their codec runs.
Ranks here are ranks within ``group``; they are mapped to global ranks for point-to-point calls.

The agreement every collective starts with (``agree``: each rank's settings and whether its own
checks refused the call, with the reason) is a small all_gather read back by the host.  On CUDA it
runs on a side stream of its own, so the host waits for the agreement alone, not for the work the
caller queued before (a copy into the tensor, a backward pass).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..errors import CorruptStreamError, InvalidArgumentError, PlanMismatchError

# torch 2.14 renamed all_gather_into_tensor (now a deprecated alias) to all_gather_single; older torch has only
# the first
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


SIZE_WORDS = 2  # a lazy payload's words, and what all_sizes gathers per rank: the byte count, then reports


def rank(group) -> int:
    return dist.get_rank(group)


def world(group) -> int:
    return dist.get_world_size(group)


def device(group) -> torch.device:
    """Where this group's tensors must live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def global_rank(group, r: int) -> int:
    """Rank ``r`` of ``group`` as a rank of the default group (what torch.distributed's ``src``/``dst`` take)."""
    return r if group is None else dist.get_global_rank(group, r)


def _size_word(n: int, group, words: int = 1) -> torch.Tensor:
    """``n`` as an int64 tensor on the group's device, followed by ``words - 1`` zero report words,
    written by fills (on CUDA kernels queued on the current stream: no host-to-device copy, which
    from pageable memory would wait for the stream's queued work)."""
    t = torch.full((words,), n, dtype=torch.int64, device=device(group))
    if words > 1:
        t[1:] = 0
    return t


def _post(ops: list, group) -> None:
    """Post sends and receives together (NCCL groups them, so neither side waits for the other).

    Every point-to-point transfer goes through ``batch_isend_irecv``, even a single one: NCCL then
    uses the group's own communicator, where a lone ``dist.send``/``dist.recv`` would set up a
    communicator for the pair of ranks the first time, in the middle of a collective."""
    p2p = [dist.P2POp(op, t, global_rank(group, peer), group, *tag) for op, t, peer, *tag in ops]
    if p2p:
        limit = _host_wait_limit(group)
        for req in dist.batch_isend_irecv(p2p):
            req.wait() if limit is None else req.wait(limit)


def _host_wait_limit(group):
    """How long the host waits for a Gloo point-to-point transfer: the group's timeout (Gloo's own
    wait has none, so a peer that stalls without closing its connection would hang us).  None for
    NCCL: a timed wait there would block the host on every transfer; NCCL's watchdog enforces the
    group's timeout itself."""
    if dist.get_backend(group) == "nccl":
        return None
    pg = group if group is not None else dist.group.WORLD
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):  # a torch without these internals: wait as torch does
        return None


@dataclass(eq=False)
class Lazy:
    """A payload whose byte count and reports are words beside it, not yet read: a GPU sum's still in
    device memory; a host sum's (``engines.HostEngine.add``) in host memory, carrying its reports the
    same way.

    ``data``: uint8 room for the payload; ``words``: two int64 words on data's device, the byte
    count, then what its maker reports beside it (error bits), zero when all is well; a maker
    that failed writes a count of ~0 (-1 as int64).  ``settle``: the words as read -> the byte
    count, raising what they report.  ``settle`` is a pure check, which ``all_sizes`` also applies
    to other ranks' words (their count only when it is -1: real counts are checked against the
    room their own rank has), so every rank raises what any rank's maker reported.  ``n``: the
    byte count once read; ``read``: the words as read.  A payload whose words went to a peer with
    it is only ``counted`` (its reports travel on, into the peer's sums: both engines carry them),
    and ``exact`` still raises them if this rank reads its bytes."""

    data: torch.Tensor
    words: torch.Tensor
    settle: Callable[[list[int]], int]
    n: int | None = None
    read: list[int] | None = None

    def __post_init__(self):
        if self.words.numel() != SIZE_WORDS:
            raise InvalidArgumentError(f"a lazy payload carries {SIZE_WORDS} words (count, reports), not "
                                       f"{self.words.numel()}")

    def settled(self, words: list[int]) -> torch.Tensor:
        self.read, self.n = words, self.settle(words)
        return self.data[: self.n]

    def counted(self, words: list[int]) -> None:
        """The count from ``words``, checked; its reports kept for ``exact`` (they went to a peer with it)."""
        self.read, self.n = words, self.settle([words[0]] + [0] * (len(words) - 1))


@dataclass(frozen=True)
class InBand:
    """Payloads that travel with their length in-band: each is sent as its room (every side knows it,
    e.g. the codec's worst case for the chunk) plus its two words (count, reports) in the same batch,
    so no host reads a size and the sender's kernels need not have run when the host posts the
    transfer.  ``room_out``: the room of what this rank sends, ``room_in``: of what it receives (a
    ring's chunks differ).  Received payloads are ``Lazy``, their words in device memory, checked by
    ``settle`` when read.  Worth it where the host round trip of a size word costs more than the
    room's unused bytes take to send (small payloads, fast links): ``engines.DeviceEngine.inband``."""

    room_out: int
    room_in: int
    settle: Callable[[list[int]], int]


def exact(p: torch.Tensor | Lazy) -> torch.Tensor:
    """The exact payload: ``p`` itself, or a lazy one's bytes (its words read now if no exchange has;
    reports of a payload that was only counted raised now)."""
    if not isinstance(p, Lazy):
        return p
    if p.n is None:
        return p.settled(p.words.tolist())
    if p.read is not None and any(p.read[1:]):
        p.settle(p.read)
    return p.data[: p.n]


def _settle(lazy: list[Lazy], read: list[int]) -> None:
    """Settle each lazy payload from its words in ``read`` (their concatenation, in order)."""
    for i, p in enumerate(lazy):
        p.settled(read[i * SIZE_WORDS : (i + 1) * SIZE_WORDS])


def exchange(sends: dict[int, torch.Tensor | Lazy], frm: list[int], group, sizes: dict[int, int] | None = None,
             inband: InBand | None = None, settle: Callable[[list[int]], int] | None = None
             ) -> dict[int, torch.Tensor | Lazy]:
    """Send ``sends[to]`` to each rank ``to`` while receiving one payload from each rank in ``frm``.

    Two batches whatever the number of peers (every size word, then every payload; the host
    reads the incoming sizes, with the words of any lazy payload sent, once, in between), or one
    with ``sizes`` (each incoming payload's byte count, already known on every side, e.g. from
    ``all_sizes``), which leaves the size words out, or one with ``inband`` (``InBand``: no host
    read; received payloads come back lazy).  Sized, each payload's two words go ahead of it: lazy
    payloads sent come back counted, and one that arrives with reports comes back ``Lazy`` (exact
    bytes), raising them where it is read (``settle``: how its maker's reports read, e.g.
    ``engines.settle_carried``; by default a CorruptStreamError naming them), or carried on by a sum
    of it (either engine); so a sum that failed in the middle of a ring reaches the ring's last sums,
    which every rank checks, instead of stopping its rank while the others wait for it."""
    if inband is not None:
        return _exchange_inband(sends, frm, group, inband)
    dev = device(group)
    lazy = [p for p in sends.values() if isinstance(p, Lazy) and p.n is None]
    if lazy and sizes is not None:
        _settle(lazy, torch.cat([p.words.to(dev) for p in lazy]).tolist())
        lazy = []
    carried = {}
    if sizes is None:
        # a payload's two words (count, reports) go out as they are, a failure's -1 included, and are
        # checked after: a sender whose kernel failed raises it and the receiver raises on the -1, neither
        # waits; reports with a good count travel on with the payload (``_carrying``) instead of stopping
        # this rank while its peers wait for it
        in_w = torch.empty(len(frm) * SIZE_WORDS, dtype=torch.int64, device=dev)
        _post([(dist.isend, _words_of(p, group), to) for to, p in sends.items()]
              + [(dist.irecv, in_w[i * SIZE_WORDS : (i + 1) * SIZE_WORDS], f) for i, f in enumerate(frm)], group)
        read = torch.cat([in_w, *(p.words.to(dev) for p in lazy)]).tolist()
        got = {f: read[i * SIZE_WORDS : (i + 1) * SIZE_WORDS] for i, f in enumerate(frm)}
        for i, p in enumerate(lazy):
            p.counted(read[(len(frm) + i) * SIZE_WORDS : (len(frm) + i + 1) * SIZE_WORDS])
        sizes = {f: w[0] for f, w in got.items()}
        bad = {f: k for f, k in sizes.items() if k < 0}
        if bad:  # a peer's kernel failed (its count word ~0): that peer raises what it found
            raise CorruptStreamError(f"ranks {sorted(bad)} sent size words {sorted(bad.values())}: their GPU kernels "
                                     "failed to size a payload")
        carried = {f: in_w[i * SIZE_WORDS : (i + 1) * SIZE_WORDS] for i, f in enumerate(frm) if any(got[f][1:])}
    sends = {to: _sent_bytes(p).to(dev) for to, p in sends.items()}
    incoming = {f: torch.empty(sizes[f], dtype=torch.uint8, device=dev) for f in frm}
    _post([(dist.isend, p, to) for to, p in sends.items()] + [(dist.irecv, incoming[f], f) for f in frm], group)
    return {f: Lazy(p, carried[f], settle or _carrying(f)) if f in carried else p for f, p in incoming.items()}


def _sent_bytes(p: torch.Tensor | Lazy) -> torch.Tensor:
    """The bytes a sized exchange sends of ``p``: a counted lazy payload's reports went with its words."""
    return p.data[: p.n] if isinstance(p, Lazy) and p.n is not None else exact(p)


def _carrying(frm: int) -> Callable[[list[int]], int]:
    """``settle`` of a payload that arrived with reports from rank ``frm``'s kernels (its bytes are exact):
    raised where this rank reads it; a sum of it carries them on instead."""

    def settle(words: list[int]) -> int:
        if any(words[1:]):
            raise CorruptStreamError(f"rank {frm} sent a payload with failure reports {words[1:]} from its GPU kernels")
        return words[0]

    return settle


_WORDS_TAG, _DATA_TAG = 1, 2  # an in-band payload's two messages to one peer (Gloo matches by tag; NCCL by order)


def _exchange_inband(sends: dict, frm: list[int], group, inband: InBand) -> dict[int, Lazy]:
    """``exchange`` with lengths in-band: one batch of every payload's words and room, no host read."""
    dev, ops, got = device(group), [], {}
    for to, p in sends.items():
        data, words = _in_room(p, inband.room_out, group)
        ops += [(dist.isend, words, to, _WORDS_TAG), (dist.isend, data, to, _DATA_TAG)]
    for f in frm:
        got[f] = Lazy(torch.empty(inband.room_in, dtype=torch.uint8, device=dev),
                      torch.empty(SIZE_WORDS, dtype=torch.int64, device=dev), inband.settle)
        ops += [(dist.irecv, got[f].words, f, _WORDS_TAG), (dist.irecv, got[f].data, f, _DATA_TAG)]
    _post(ops, group)
    return got


def _in_room(p: torch.Tensor | Lazy, room: int, group) -> tuple[torch.Tensor, torch.Tensor]:
    """A payload as ``room`` bytes and its two words, on the group's device: a lazy one's own buffer and
    words (whether read or not); an exact one copied into a room (its count written by a fill)."""
    dev = device(group)
    # rooms come from sizes every rank agreed on, so a mismatch here is this code's own error; it is raised
    # before anything is posted, on the ranks that meet it (a peer that does not would wait for the timeout)
    if isinstance(p, Lazy):
        if p.data.numel() != room:
            raise InvalidArgumentError(f"an in-band payload's buffer holds {p.data.numel()} bytes, not the agreed room "
                                       f"of {room}")
        data = p.data.to(dev)
    elif p.numel() > room:
        raise InvalidArgumentError(f"a {p.numel()}-byte payload does not fit the agreed in-band room of {room} bytes")
    else:
        data = torch.empty(room, dtype=torch.uint8, device=dev)
        data[: p.numel()] = p.to(dev)
    return data, _words_of(p, group)


def _words_of(p: torch.Tensor | Lazy, group) -> torch.Tensor:
    """The two words (count, reports) sent ahead of ``p``: a lazy payload's own, in device memory."""
    if isinstance(p, Lazy):
        return p.words.to(device(group))
    return _size_word(p.numel(), group, SIZE_WORDS)


def sendrecv(payload: torch.Tensor | Lazy, to: int, frm: int, group, size: int | None = None,
             inband: InBand | None = None, settle: Callable[[list[int]], int] | None = None) -> torch.Tensor | Lazy:
    """Send ``payload`` to rank ``to`` while receiving one from rank ``frm`` (no ordering deadlock);
    ``size``: the incoming payload's byte count where every side knows it already (no size words);
    ``inband``: lengths in-band (``InBand``; the result is lazy); ``settle``: as in ``exchange``."""
    return exchange({to: payload}, [frm], group, None if size is None else {frm: size}, inband, settle)[frm]


def send(payload: torch.Tensor | Lazy, to: int, group, inband: InBand | None = None) -> None:
    exchange({to: payload}, [], group, inband=inband)


def recv(frm: int, group, inband: InBand | None = None, settle: Callable[[list[int]], int] | None = None
         ) -> torch.Tensor | Lazy:
    return exchange({}, [frm], group, inband=inband, settle=settle)[frm]


def all_sizes(n: int | torch.Tensor | Lazy, group) -> list[int]:
    """Every rank's byte count ``n`` (a number or a payload's), on every rank: one all_gather of two
    words per rank (count, reports) and one host read, whether ``n`` is a number, a payload or a lazy
    payload (so ranks may mix them).

    A lazy payload comes back settled; every rank then checks every rank's reports, so what one
    rank's maker reported is raised on all of them."""
    dev, w, me = device(group), world(group), rank(group)
    mine = n.words.to(dev) if isinstance(n, Lazy) else \
        _size_word(n if isinstance(n, int) else n.numel(), group, SIZE_WORDS)
    table = torch.empty(w * SIZE_WORDS, dtype=torch.int64, device=dev)
    _all_gather_single(table, mine, group)
    read = table.tolist()
    rows = [read[i * SIZE_WORDS : (i + 1) * SIZE_WORDS] for i in range(w)]
    if isinstance(n, Lazy):
        n.settled(rows[me])
        for i, row in enumerate(rows):
            if i != me:  # another rank's reports, and its count only if it is a failure word (-1)
                n.settle([min(row[0], 0), *row[1:]])
    bad = {i: row for i, row in enumerate(rows) if row[0] < 0 or any(row[1:])}
    if bad:  # reports this rank cannot read (it holds no lazy payload): the reporting ranks raise them
        raise CorruptStreamError(f"ranks {sorted(bad)} reported failures with their payloads (words "
                                 f"{list(bad.values())})")
    return [row[0] for row in rows]


def all_gather(payload: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's payload, on every rank: sizes first, then payloads padded to the largest."""
    w, dev = world(group), device(group)
    n = all_sizes(payload.numel(), group)
    slot = -(-max(n) // 16) * 16  # 16-byte slots keep every payload aligned for the GPU decoders
    padded = torch.zeros(slot, dtype=torch.uint8, device=dev)
    padded[: payload.numel()] = payload.to(dev)
    out = torch.empty(w * slot, dtype=torch.uint8, device=dev)
    _all_gather_single(out, padded, group)
    return [out[i * slot : i * slot + k] for i, k in enumerate(n)]


def broadcast(payload: torch.Tensor | None, src: int, group) -> torch.Tensor:
    dev = device(group)
    n = _size_word(payload.numel() if payload is not None else 0, group)
    dist.broadcast(n, global_rank(group, src), group)
    buf = payload.to(dev) if rank(group) == src else torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
    dist.broadcast(buf, global_rank(group, src), group)
    return buf


REASON_BYTES = 256  # a refusing rank's reason in its agreement row: UTF-8, cut to this, zero-padded


def agree(values: list[float], group, what: str, fields=None, refusal: str | None = None) -> dict[int, str]:
    """Every rank's settings ``values`` and status, met in one all_gather of a row per rank: the settings
    (float64 bit patterns), a status word (1: this rank refused its call) and ``refusal``, the refusing
    rank's reason (``REASON_BYTES`` of UTF-8).  Returns {rank: reason} of the ranks that refused, on every
    rank alike (their settings are not compared: a rank that refused has none).  When none refused and the
    ranks disagree on ``values``, raises ``PlanMismatchError`` on every rank (so a mismatch never hangs),
    naming each differing field (``fields[i]`` names ``values[i]``) and every rank's value of it."""
    dev, w, k = device(group), world(group), len(values)
    row = np.zeros(k + 1 + REASON_BYTES // 8, np.int64)
    row[:k] = np.asarray(values, np.float64).view(np.int64)
    if refusal is not None:
        text = refusal.encode("utf-8")[:REASON_BYTES]
        row[k] = 1
        row[k + 1 :].view(np.uint8)[: len(text)] = np.frombuffer(text, np.uint8)
    if dev.type == "cuda":
        table = _gather_on_side_stream(row, group, dev)
    else:
        table = _gather_on_host(torch.from_numpy(row), group).numpy()
    table = table.reshape(w, row.size)
    refused = {r: table[r, k + 1 :].tobytes().rstrip(b"\0").decode("utf-8", "replace") for r in range(w) if table[r, k]}
    if refused:
        return refused
    keys = table[:, :k]
    differ = np.flatnonzero((keys != keys[0]).any(0)).tolist()
    if differ:
        names = list(fields) if fields is not None and len(fields) == k else [f"setting {i}" for i in range(k)]
        shown = keys.view(np.float64)
        rows = "; ".join(f"{names[i]}: " + ", ".join(f"rank {r} {v:g}" for r, v in enumerate(shown[:, i].tolist()))
                         for i in differ)
        raise PlanMismatchError(f"ranks disagree on {what}: {rows}")
    return {}


def _gather_on_host(mine: torch.Tensor, group) -> torch.Tensor:
    everyone = torch.empty(world(group) * mine.numel(), dtype=mine.dtype)
    _all_gather_single(everyone, mine, group)
    return everyone


class _AgreeBuffers:
    """The side stream and buffers of a device's settings agreements, made once: a pinned host row (int64),
    its device copy, the device table and its pinned host copy (the functional API agrees on every
    call, so per-call allocations and pinning would be a fixed cost of each)."""

    def __init__(self, dev: torch.device, k: int, w: int):
        self.stream = torch.cuda.Stream(dev)
        self.lock = threading.Lock()  # a plan made on one thread while a call agrees on the background one
        self.host_in = torch.empty(k, dtype=torch.int64, pin_memory=True)
        self.dev_in = torch.empty(k, dtype=torch.int64, device=dev)
        self.dev_out = torch.empty(w * k, dtype=torch.int64, device=dev)
        self.host_out = torch.empty(w * k, dtype=torch.int64, pin_memory=True)


_AGREE: dict[tuple, _AgreeBuffers] = {}
_AGREE_LOCK = threading.Lock()


def _agree_buffers(dev: torch.device, k: int, w: int) -> _AgreeBuffers:
    with _AGREE_LOCK:
        key = (dev.index, k, w)
        if key not in _AGREE:
            _AGREE[key] = _AgreeBuffers(dev, k, w)
        return _AGREE[key]


def _gather_on_side_stream(row: np.ndarray, group, dev: torch.device) -> np.ndarray:
    """all_gather of a small int64 ``row`` on ``dev`` without waiting for the caller's queued work.

    Upload, all_gather and read-back are queued on an otherwise idle side stream: NCCL's
    stream then depends on that stream only (not on the caller's), and the host waits for
    this stream alone.  Host buffers are pinned, so the copies are true asynchronous copies on
    that stream; they are written only after the previous agreement's stream work is done."""
    b = _agree_buffers(dev, row.size, world(group))
    with b.lock:
        b.host_in.numpy()[:] = row
        with torch.cuda.stream(b.stream):
            b.dev_in.copy_(b.host_in, non_blocking=True)
            _all_gather_single(b.dev_out, b.dev_in, group)
            b.host_out.copy_(b.dev_out, non_blocking=True)
            b.stream.synchronize()
        return b.host_out.numpy().copy()
