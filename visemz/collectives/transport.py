"""Moving compressed payloads between ranks with torch.distributed (NCCL or Gloo carry every byte).

Payloads are 1-D uint8 tensors.  An exchange sends sizes before payloads (unless every side
already knows them, e.g. from ``all_sizes``), so receivers allocate exactly what arrives.
Tensors travel on the group's own device: CUDA for NCCL (compressed bytes never visit the
host; only the int64 size words are read back), the CPU for Gloo.  Received payloads come back on that device; callers move them where their codec runs.
Ranks here are ranks within ``group``; they are mapped to global ranks for point-to-point calls.

The settings agreement every collective starts with (``agree``) is a small all_gather read back
by the host.  On CUDA it runs on a side stream of its own, so the host waits for the agreement
alone, not for the work the caller queued before (a copy into the tensor, a backward pass).
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from ..errors import PlanMismatchError

# torch 2.14 renamed all_gather_into_tensor (now a deprecated alias) to all_gather_single; older torch has only the first
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def rank(group) -> int:
    return dist.get_rank(group)


def world(group) -> int:
    return dist.get_world_size(group)


def device(group) -> torch.device:
    """Where this group's tensors must live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _global(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _size_word(n: int, group) -> torch.Tensor:
    """``n`` as a one-element int64 tensor on the group's device, written by a fill (on CUDA a kernel
    queued on the current stream: no host-to-device copy, which from pageable memory would wait for
    the stream's queued work)."""
    return torch.full((1,), n, dtype=torch.int64, device=device(group))


def _post(ops: list, group) -> None:
    """Post sends and receives together (NCCL groups them, so neither side waits for the other).

    Every point-to-point transfer goes through ``batch_isend_irecv``, even a single one: NCCL then
    uses the group's own communicator, where a lone ``dist.send``/``dist.recv`` would set up a
    communicator for the pair of ranks the first time, in the middle of a collective."""
    p2p = [dist.P2POp(op, t, _global(group, peer), group) for op, t, peer in ops]
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


def exchange(sends: dict[int, torch.Tensor], frm: list[int], group, sizes: dict[int, int] | None = None
             ) -> dict[int, torch.Tensor]:
    """Send ``sends[to]`` to each rank ``to`` while receiving one payload from each rank in ``frm``.

    Two batches whatever the number of peers (every size word, then every payload; the host
    reads the incoming sizes once, in between), or one with ``sizes`` (each incoming payload's byte count,
    already known on every side, e.g. from ``all_sizes``), which leaves the size words out."""
    dev = device(group)
    sends = {to: p.to(dev) for to, p in sends.items()}
    if sizes is None:
        in_n = torch.empty(len(frm), dtype=torch.int64, device=dev)
        _post([(dist.isend, _size_word(p.numel(), group), to) for to, p in sends.items()]
              + [(dist.irecv, in_n[i : i + 1], f) for i, f in enumerate(frm)], group)
        sizes = dict(zip(frm, in_n.tolist()))
    incoming = {f: torch.empty(sizes[f], dtype=torch.uint8, device=dev) for f in frm}
    _post([(dist.isend, p, to) for to, p in sends.items()] + [(dist.irecv, incoming[f], f) for f in frm], group)
    return incoming


def sendrecv(payload: torch.Tensor, to: int, frm: int, group, size: int | None = None) -> torch.Tensor:
    """Send ``payload`` to rank ``to`` while receiving one from rank ``frm`` (no ordering deadlock);
    ``size``: the incoming payload's byte count where every side knows it already (no size words)."""
    return exchange({to: payload}, [frm], group, None if size is None else {frm: size})[frm]


def send(payload: torch.Tensor, to: int, group) -> None:
    exchange({to: payload}, [], group)


def recv(frm: int, group) -> torch.Tensor:
    return exchange({}, [frm], group)[frm]


def all_sizes(n: int, group) -> list[int]:
    """Every rank's ``n``, on every rank: one all_gather of size words and one host read."""
    sizes = torch.empty(world(group), dtype=torch.int64, device=device(group))
    _all_gather_single(sizes, _size_word(n, group), group)
    return sizes.tolist()


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
    dist.broadcast(n, _global(group, src), group)
    buf = payload.to(dev) if rank(group) == src else torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
    dist.broadcast(buf, _global(group, src), group)
    return buf


def agree(values: list[float], group, what: str, fields=None) -> None:
    """Raise ``PlanMismatchError`` on every rank when ranks disagree on ``values`` (so a mismatch
    never hangs); the message names each differing field (``fields[i]`` names ``values[i]``) and
    every rank's value of it."""
    dev = device(group)
    gather = _gather_on_side_stream if dev.type == "cuda" else _gather_on_host
    table = gather(torch.tensor(values, dtype=torch.float64), group, dev).reshape(world(group), len(values))
    differ = (table != table[0]).any(0).nonzero().flatten().tolist()
    if differ:
        names = list(fields) if fields is not None and len(fields) == len(values) else [f"setting {i}" for i in range(len(values))]
        rows = "; ".join(f"{names[i]}: " + ", ".join(f"rank {r} {v:g}" for r, v in enumerate(table[:, i].tolist())) for i in differ)
        raise PlanMismatchError(f"ranks disagree on {what}: {rows}")


def _gather_on_host(mine: torch.Tensor, group, dev: torch.device) -> torch.Tensor:
    everyone = torch.empty(world(group) * mine.numel(), dtype=mine.dtype)
    _all_gather_single(everyone, mine, group)
    return everyone


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}
_SIDE_LOCK = threading.Lock()


def _side_stream(dev: torch.device) -> torch.cuda.Stream:
    with _SIDE_LOCK:
        if dev.index not in _SIDE_STREAMS:
            _SIDE_STREAMS[dev.index] = torch.cuda.Stream(dev)
        return _SIDE_STREAMS[dev.index]


def _gather_on_side_stream(mine: torch.Tensor, group, dev: torch.device) -> torch.Tensor:
    """all_gather of a few numbers on ``dev`` without waiting for the caller's queued work.

    Upload, all_gather and read-back are queued on an otherwise idle side stream: NCCL's
    stream then depends on that stream only (not on the caller's), and the host waits for
    this stream alone.  Host buffers are pinned (from torch's caching host allocator) so the
    copies are true asynchronous copies on that stream."""
    side = _side_stream(dev)
    mine = mine.pin_memory()
    out = torch.empty(world(group) * mine.numel(), dtype=mine.dtype, pin_memory=True)
    with torch.cuda.stream(side):
        on_dev = mine.to(dev, non_blocking=True)
        everyone = torch.empty(out.numel(), dtype=mine.dtype, device=dev)
        _all_gather_single(everyone, on_dev, group)
        out.copy_(everyone, non_blocking=True)
        side.synchronize()
    return out
