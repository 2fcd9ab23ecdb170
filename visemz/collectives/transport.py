"""Moving compressed bytes between ranks with torch.distributed (NCCL or Gloo carry every byte).

Sizes travel before payloads, so receivers allocate exactly what arrives.  Ranks here
are ranks within ``group``; they are mapped to global ranks for point-to-point calls.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError


def rank(group) -> int:
    return dist.get_rank(group)


def world(group) -> int:
    return dist.get_world_size(group)


def _global(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _u8(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def sendrecv(payload: bytes, to: int, frm: int, group) -> bytes:
    """Send ``payload`` to rank ``to`` while receiving one from rank ``frm`` (no ordering deadlock)."""
    out_n = torch.tensor([len(payload)], dtype=torch.int64)
    in_n = torch.empty(1, dtype=torch.int64)
    for w in (dist.isend(out_n, _global(group, to), group), dist.irecv(in_n, _global(group, frm), group)):
        w.wait()
    incoming = torch.empty(int(in_n.item()), dtype=torch.uint8)
    for w in (dist.isend(_u8(payload), _global(group, to), group), dist.irecv(incoming, _global(group, frm), group)):
        w.wait()
    return incoming.numpy().tobytes()


def send(payload: bytes, to: int, group) -> None:
    dist.send(torch.tensor([len(payload)], dtype=torch.int64), _global(group, to), group)
    dist.send(_u8(payload), _global(group, to), group)


def recv(frm: int, group) -> bytes:
    n = torch.empty(1, dtype=torch.int64)
    dist.recv(n, _global(group, frm), group)
    out = torch.empty(int(n.item()), dtype=torch.uint8)
    dist.recv(out, _global(group, frm), group)
    return out.numpy().tobytes()


def all_gather_bytes(payload: bytes, group) -> list[bytes]:
    """Every rank's payload, on every rank: sizes first, then payloads padded to the largest."""
    w = world(group)
    sizes = [torch.empty(1, dtype=torch.int64) for _ in range(w)]
    dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64), group)
    n = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(n), dtype=torch.uint8)
    padded[: len(payload)] = _u8(payload)
    bufs = [torch.empty(max(n), dtype=torch.uint8) for _ in range(w)]
    dist.all_gather(bufs, padded, group)
    return [b[:k].numpy().tobytes() for b, k in zip(bufs, n)]


def broadcast_bytes(payload: bytes | None, src: int, group) -> bytes:
    n = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
    dist.broadcast(n, _global(group, src), group)
    buf = _u8(payload) if rank(group) == src else torch.empty(int(n.item()), dtype=torch.uint8)
    dist.broadcast(buf, _global(group, src), group)
    return buf.numpy().tobytes()


def agree(values: list[float], group, what: str) -> None:
    """Raise on every rank when ranks disagree on ``values`` (so a mismatch never hangs)."""
    mine = torch.tensor(values, dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(world(group))]
    dist.all_gather(everyone, mine, group)
    table = np.stack([t.numpy() for t in everyone])
    if not (table == table[0]).all():
        raise InvalidArgumentError(f"ranks disagree on {what}: " + "; ".join(f"rank {i}: {list(r)}" for i, r in enumerate(table)))
