"""Compressed collectives shaped like torch.distributed's, in place like torch's.

    visemz.collectives.all_reduce(tensor, op="sum", group=None, codec=DEFAULT_CODEC,
                                  algorithm="auto", async_op=False)

Error-bounded all_reduce: ring (homomorphic reduce-scatter, then compressed all-gather) or
recursive doubling (non-power-of-two world sizes fold the extra ranks in first), see
``algorithms.py``; every rank ends with identical values, within W * eb of the exact sum for
W ranks.  ``auto`` picks ring, recursive doubling or plain from timings of each on the group
(``autotune.py``, ``cost.py``).  Lossless: the compressed tensors are gathered and summed in
float64 in rank order, the same on every rank; ``auto`` keeps that (plain would change the
values, not only the speed: pass ``codec=None`` for torch.distributed's own sum).
``codec=None`` or ``algorithm="plain"`` is torch.distributed's own, uncompressed.
Each call first checks that all ranks agree on its settings; a mismatch raises on every rank.
Data-movement collectives (all_gather, broadcast, scatter, all_to_all) leave every copy of a
tensor, the sender's included, equal to the decoded data, so ranks agree exactly.
With ``ErrorBounded(eb, "lorenzo2d")`` every collective predicts along rows of its tensors' last
dimension, which every tensor of the call must have 2 or more dimensions to give and must share
(``calls.row_length``; else ``InvalidArgumentError`` naming the codec and the collective); the row
length is one of the settings the ranks agree on.

CUDA tensors are compressed, added and decoded on their GPU (``engines.DeviceEngine``) and on
an NCCL group the compressed bytes move GPU to GPU; CPU tensors use the NumPy codecs.  Both
give the same bytes, so the results are the same wherever the work runs.

Calls run in the order they are made, on every rank: an ``async_op=True`` call runs on this
process's one background thread (on the caller's CUDA device and stream), and a later call,
asynchronous or not, queues behind it while it is pending.  The settings agreement runs inside
that order too, so a mismatch in an asynchronous call is raised by its ``wait()``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError
from . import transport as T
from .algorithms import phase_times, ring_reduce_scatter, write_values
from .calls import ALGORITHMS, DEFAULT_CODEC, OPS, Handle, agree, flat, last_algorithm, row_length, run, settings
from .codecs import Lossless
from .cost import CostModel
from .engines import engine_for
from .plans import plan_for

__all__ = ["ALGORITHMS", "OPS", "CostModel", "Handle", "all_gather", "all_reduce", "all_to_all",
           "broadcast", "last_algorithm", "phase_times", "reduce_scatter", "scatter"]

# ---------------------------------------------------------------- all_reduce
def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, codec=DEFAULT_CODEC,
               algorithm: str = "auto", async_op: bool = False):
    """Reduce ``tensor`` across ranks in place (compressed unless codec is None or algorithm 'plain').

    Runs the cached plan of these settings (``plans.plan_for``: made, and agreed across ranks,
    on first use); every call still agrees on its settings first, which is what makes a call
    that differs between ranks raise instead of hang.  A ``Plan`` made once skips that too."""
    flat(tensor)
    settings([tensor], op, codec, algorithm, "all_reduce")  # bad arguments raise here, on the caller's thread

    def work():
        p, made = plan_for(tensor, op, group, codec, algorithm)  # a new plan has just agreed on these settings
        if not made:
            agree(p.key, group, "all_reduce")
        return p.run(tensor)

    return run(work, async_op)


# ------------------------------------------------------------ reduce_scatter
def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: str = "sum", group=None,
                   codec=DEFAULT_CODEC, async_op: bool = False):
    """output on rank r = reduction over ranks of input_list[r]."""
    w = T.world(group)
    if len(input_list) != w:
        raise InvalidArgumentError(f"reduce_scatter needs {w} inputs (one per rank), got {len(input_list)}")
    row = row_length(codec, [output, *input_list], "reduce_scatter")
    key, name = settings([output, *input_list], op, codec, "auto", "reduce_scatter", row=row)
    out = flat(output)

    def work():
        agree(key, group, "reduce_scatter")
        r = T.rank(group)
        if codec is None:
            stacked = torch.cat([t.reshape(-1) for t in input_list])
            dist.all_reduce(stacked, group=group)
            a = r * out.numel()
            out.copy_(stacked[a : a + out.numel()] / (w if op == "avg" else 1))
            return output
        eng, n = engine_for(out, codec, row), out.numel()
        mine = eng.encode_many([t.reshape(-1) for t in input_list])
        if isinstance(codec, Lossless):  # every rank's part r, summed in rank order
            got = T.exchange({j: mine[j] for j in range(w) if j != r}, [j for j in range(w) if j != r], group)
            total = sum(eng.values(mine[j] if j == r else got[j], n, name) for j in range(w))
        else:
            summed = ring_reduce_scatter(eng, mine, [n] * w, group)
            # every rank's sum words in one gather: a failure on any chunk's chain (which only its owner's sum
            # carries) is raised on every rank, not on the owner alone while the others go on
            T.all_sizes(summed, group)
            total = eng.values(summed, n, name)
        write_values(out, total / w if op == "avg" else total)
        return output

    return run(work, async_op)


# --------------------------------------------------- data-movement collectives
def _decode_into(eng, payload: torch.Tensor, out: torch.Tensor, name: str) -> None:
    write_values(out, eng.values(payload, out.numel(), name))


def _moved(op: str, key, group, codec, like: torch.Tensor, plain, compressed, async_op: bool, row: int = 0):
    """Run a data-movement collective: agree on the settings, then ``plain()`` (torch.distributed's
    own) when codec is None, else ``compressed(engine)`` (``row``: 2-D prediction's row length)."""

    def work():
        agree(key, group, op)
        return plain() if codec is None else compressed(engine_for(like, codec, row))

    return run(work, async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group=None, codec=DEFAULT_CODEC,
               async_op: bool = False):
    w = T.world(group)
    if len(tensor_list) != w:
        raise InvalidArgumentError(f"all_gather needs {w} outputs (one per rank), got {len(tensor_list)}")
    row = row_length(codec, [tensor, *tensor_list], "all_gather")
    key, name = settings([tensor, *tensor_list], "sum", codec, "auto", "all_gather", row=row)

    def plain():
        dist.all_gather(tensor_list, tensor, group)
        return tensor_list

    def compressed(eng):
        for out, p in zip(tensor_list, T.all_gather(eng.encode_many([flat(tensor)])[0], group)):
            _decode_into(eng, p, flat(out), name)
        return tensor_list

    return _moved("all_gather", key, group, codec, tensor, plain, compressed, async_op, row)


def broadcast(tensor: torch.Tensor, src: int, group=None, codec=DEFAULT_CODEC, async_op: bool = False):
    row = row_length(codec, [tensor], "broadcast")
    key, name = settings([tensor], "sum", codec, "auto", "broadcast", src, row)

    def plain():
        dist.broadcast(tensor, src, group)
        return tensor

    def compressed(eng):
        mine = eng.encode_many([flat(tensor)])[0] if T.rank(group) == src else None
        _decode_into(eng, T.broadcast(mine, src, group), flat(tensor), name)
        return tensor

    return _moved("broadcast", key, group, codec, tensor, plain, compressed, async_op, row)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int, group=None,
            codec=DEFAULT_CODEC, async_op: bool = False):
    """The root compresses each part once (GPU: each on its own stream) and sends them all at once
    (sizes first)."""
    r, w = T.rank(group), T.world(group)
    if r == src and (scatter_list is None or len(scatter_list) != w):
        raise InvalidArgumentError(f"scatter's root needs a list of {w} tensors")
    row = row_length(codec, [tensor, *(scatter_list if r == src else [])], "scatter")  # the root's parts too
    key, name = settings([tensor], "sum", codec, "auto", "scatter", src, row)

    def plain():
        dist.scatter(tensor, scatter_list if r == src else None, src, group)
        return tensor

    def compressed(eng):
        if r == src:
            parts = eng.encode_many([flat(t.contiguous()) for t in scatter_list])
            T.exchange({i: p for i, p in enumerate(parts) if i != src}, [], group)
            _decode_into(eng, parts[src], flat(tensor), name)
        else:
            _decode_into(eng, T.exchange({}, [src], group)[src], flat(tensor), name)
        return tensor

    return _moved("scatter", key, group, codec, tensor, plain, compressed, async_op, row)


def all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor], group=None,
               codec=DEFAULT_CODEC, async_op: bool = False):
    """Rank r sends input_list[j] to rank j; each part is compressed once (GPU: on its own stream),
    and all parts travel at once (sizes first)."""
    w = T.world(group)
    if len(output_list) != w or len(input_list) != w:
        raise InvalidArgumentError(f"all_to_all needs {w} inputs and {w} outputs")
    row = row_length(codec, [*input_list, *output_list], "all_to_all")
    key, name = settings([*input_list, *output_list], "sum", codec, "auto", "all_to_all", row=row)

    def work():
        agree(key, group, "all_to_all")
        r = T.rank(group)
        if codec is None and T.device(group).type == "cuda":
            dist.all_to_all(output_list, [t.contiguous() for t in input_list], group)
            return output_list
        # Gloo has no all_to_all: the uncompressed path there is the exact (lossless) exchange
        eng = engine_for(input_list[0], codec if codec is not None else Lossless(), row)
        parts = eng.encode_many([flat(t.contiguous()) for t in input_list])
        others = [j for j in range(w) if j != r]
        got = T.exchange({j: parts[j] for j in others}, others, group)
        _decode_into(eng, parts[r], flat(output_list[r]), name)
        for j in others:
            _decode_into(eng, got[j], flat(output_list[j]), name)
        return output_list

    return run(work, async_op)
