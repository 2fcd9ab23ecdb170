"""Moving compressed payloads between ranks with torch.distributed (NCCL or Gloo carry every byte).

Payloads are 1-D uint8 tensors.  Each exchange sends sizes before payloads, so receivers
allocate exactly what arrives.  Tensors travel on the group's own device: CUDA for NCCL
(compressed bytes never visit the host; only the int64 size words are read back), the CPU for
Gloo.  Received payloads come back on that device; callers move them where their codec runs.
Ranks here are ranks within ``group``; they are mapped to global ranks for point-to-point calls.
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


def device(group) -> torch.device:
    """Where this group's tensors must live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _global(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _size_word(n: int, group) -> torch.Tensor:
    return torch.tensor([n], dtype=torch.int64, device=device(group))


def _exchange(ops: list, group) -> None:
    """Post sends and receives together (NCCL groups them, so neither side waits for the other)."""
    p2p = [dist.P2POp(op, t, _global(group, peer), group) for op, t, peer in ops]
    for req in dist.batch_isend_irecv(p2p):
        req.wait()


def sendrecv(payload: torch.Tensor, to: int, frm: int, group) -> torch.Tensor:
    """Send ``payload`` to rank ``to`` while receiving one from rank ``frm`` (no ordering deadlock)."""
    payload = payload.to(device(group))
    in_n = torch.empty(1, dtype=torch.int64, device=payload.device)
    _exchange([(dist.isend, _size_word(payload.numel(), group), to), (dist.irecv, in_n, frm)], group)
    incoming = torch.empty(int(in_n.item()), dtype=torch.uint8, device=payload.device)
    _exchange([(dist.isend, payload, to), (dist.irecv, incoming, frm)], group)
    return incoming


def send(payload: torch.Tensor, to: int, group) -> None:
    payload = payload.to(device(group))
    dist.send(_size_word(payload.numel(), group), _global(group, to), group)
    dist.send(payload, _global(group, to), group)


def recv(frm: int, group) -> torch.Tensor:
    n = torch.empty(1, dtype=torch.int64, device=device(group))
    dist.recv(n, _global(group, frm), group)
    out = torch.empty(int(n.item()), dtype=torch.uint8, device=n.device)
    dist.recv(out, _global(group, frm), group)
    return out


def all_gather(payload: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's payload, on every rank: sizes first, then payloads padded to the largest."""
    w, dev = world(group), device(group)
    sizes = torch.empty(w, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(sizes, _size_word(payload.numel(), group), group)
    n = sizes.tolist()
    slot = -(-max(n) // 16) * 16  # 16-byte slots keep every payload aligned for the GPU decoders
    padded = torch.zeros(slot, dtype=torch.uint8, device=dev)
    padded[: payload.numel()] = payload.to(dev)
    out = torch.empty(w * slot, dtype=torch.uint8, device=dev)
    dist.all_gather_into_tensor(out, padded, group)
    return [out[i * slot : i * slot + k] for i, k in enumerate(n)]


def broadcast(payload: torch.Tensor | None, src: int, group) -> torch.Tensor:
    dev = device(group)
    n = _size_word(payload.numel() if payload is not None else 0, group)
    dist.broadcast(n, _global(group, src), group)
    buf = payload.to(dev) if rank(group) == src else torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
    dist.broadcast(buf, _global(group, src), group)
    return buf


def agree(values: list[float], group, what: str) -> None:
    """Raise on every rank when ranks disagree on ``values`` (so a mismatch never hangs)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device(group))
    everyone = torch.empty(world(group) * len(values), dtype=torch.float64, device=mine.device)
    dist.all_gather_into_tensor(everyone, mine, group)
    table = everyone.cpu().numpy().reshape(world(group), len(values))
    if not (table == table[0]).all():
        raise InvalidArgumentError(f"ranks disagree on {what}: " + "; ".join(f"rank {i}: {list(r)}" for i, r in enumerate(table)))
