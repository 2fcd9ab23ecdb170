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
Each call first checks its arguments on this rank (the error-bounded codec's refusals of NaN, Inf
and values beyond int32 steps included), then meets every rank in one small agreement of their
settings and of whether their checks refused the call (``calls.collective``), before any compressed
step: an argument wrong on any rank, or settings that differ, raise on every rank.  Every failure
after that is a visemz error on every rank too: a peer that died, left or timed out is
``PeerFailedError``, and a sum leaving int32 in the middle of a ring reaches every rank with the sums.
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
asynchronous or not, queues behind it while it is pending; it returns a ``calls.Handle``, a
``torch.futures.Future`` of its result.  The agreement runs inside that order too, so a mismatch in
an asynchronous call is raised by its ``wait()``; arguments this rank refuses are raised at the
call as well.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..floats import Lossless
from . import transport as T
from .algorithms import phase_times, ring_reduce_scatter, write_values
from .calls import (
    ALGORITHMS,
    DEFAULT_CODEC,
    OPS,
    Handle,
    check_count,
    check_root,
    check_sizes,
    collective,
    flat,
    last_algorithm,
    row_length,
    settings,
)
from .cost import CostModel
from .engines import engine_for
from .plans import plan_for, plan_settings

__all__ = ["ALGORITHMS", "OPS", "CostModel", "Handle", "all_gather", "all_reduce", "all_to_all",
           "broadcast", "last_algorithm", "phase_times", "reduce_scatter", "scatter"]

# ---------------------------------------------------------------- all_reduce
def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, codec=DEFAULT_CODEC,
               algorithm: str = "auto", async_op: bool = False):
    """Reduce ``tensor`` across ranks in place (compressed unless codec is None or algorithm 'plain').

    Runs the cached plan of these settings (``plans.plan_for``, made on first use); every call still
    agrees on its settings and this rank's checks first, which is what makes a call that differs
    between ranks, or is wrong on one, raise instead of hang.  A ``Plan`` made once skips that."""

    def check():
        key, _ = plan_settings(tensor, op, codec, algorithm)
        return key, None, [tensor] if algorithm != "plain" else []

    def body(_):
        return plan_for(tensor, op, group, codec, algorithm).run(tensor)

    return collective("all_reduce", group, codec, check, body, async_op, tensor)


# ------------------------------------------------------------ reduce_scatter
def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: str = "sum", group=None,
                   codec=DEFAULT_CODEC, async_op: bool = False):
    """output on rank r = reduction over ranks of input_list[r]."""

    def check():
        w = T.world(group)
        check_count(input_list, w, "reduce_scatter", "inputs")
        check_sizes([output, *input_list], "reduce_scatter")
        flat(output)
        row = row_length(codec, [output, *input_list], "reduce_scatter")
        key, name = settings([output, *input_list], op, codec, "auto", "reduce_scatter", row=row)
        return key, (w, name, row), input_list

    def body(found):
        w, name, row = found
        r, out = T.rank(group), flat(output)
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

    return collective("reduce_scatter", group, codec, check, body, async_op, output)


# --------------------------------------------------- data-movement collectives
def _decode_into(eng, payload: torch.Tensor, out: torch.Tensor, name: str) -> None:
    write_values(out, eng.values(payload, out.numel(), name))


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group=None, codec=DEFAULT_CODEC,
               async_op: bool = False):
    def check():
        check_count(tensor_list, T.world(group), "all_gather", "outputs")
        check_sizes([tensor, *tensor_list], "all_gather")
        for t in (tensor, *tensor_list):
            flat(t)
        row = row_length(codec, [tensor, *tensor_list], "all_gather")
        key, name = settings([tensor, *tensor_list], "sum", codec, "auto", "all_gather", row=row)
        return key, (name, row), [tensor]

    def body(found):
        name, row = found
        if codec is None:
            dist.all_gather(tensor_list, tensor, group)
            return tensor_list
        eng = engine_for(tensor, codec, row)
        for out, p in zip(tensor_list, T.all_gather(eng.encode_many([flat(tensor)])[0], group)):
            _decode_into(eng, p, flat(out), name)
        return tensor_list

    return collective("all_gather", group, codec, check, body, async_op, tensor)


def broadcast(tensor: torch.Tensor, src: int, group=None, codec=DEFAULT_CODEC, async_op: bool = False):
    def check():
        root = check_root(src, T.world(group), "broadcast")
        flat(tensor)
        row = row_length(codec, [tensor], "broadcast")
        key, name = settings([tensor], "sum", codec, "auto", "broadcast", root, row)
        return key, (root, name, row), [tensor] if T.rank(group) == root else []  # the others' tensors are outputs

    def body(found):
        root, name, row = found
        if codec is None:
            dist.broadcast(tensor, T.global_rank(group, root), group)
            return tensor
        eng = engine_for(tensor, codec, row)
        mine = eng.encode_many([flat(tensor)])[0] if T.rank(group) == root else None
        _decode_into(eng, T.broadcast(mine, root, group), flat(tensor), name)
        return tensor

    return collective("broadcast", group, codec, check, body, async_op, tensor)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int, group=None,
            codec=DEFAULT_CODEC, async_op: bool = False):
    """The root compresses each part once (GPU: each on its own stream) and sends them all at once
    (sizes first)."""

    def check():
        r, w = T.rank(group), T.world(group)
        root = check_root(src, w, "scatter")
        flat(tensor)
        parts = []
        if r == root:  # the others' lists are not used
            check_count(scatter_list, w, "scatter's root", "tensors")
            parts = list(scatter_list)
            check_sizes([tensor, *parts], "scatter")
            settings([tensor, *parts], "sum", codec, "auto", "scatter")  # one dtype
        row = row_length(codec, [tensor, *parts], "scatter")  # the root's parts too
        key, name = settings([tensor], "sum", codec, "auto", "scatter", root, row)
        return key, (r, root, parts, name, row), parts

    def body(found):
        r, root, parts, name, row = found
        if codec is None:
            dist.scatter(tensor, parts if r == root else None, T.global_rank(group, root), group)
            return tensor
        eng = engine_for(tensor, codec, row)
        if r == root:
            sent = eng.encode_many([flat(t.contiguous()) for t in parts])
            T.exchange({i: p for i, p in enumerate(sent) if i != root}, [], group)
            _decode_into(eng, sent[root], flat(tensor), name)
        else:
            _decode_into(eng, T.exchange({}, [root], group)[root], flat(tensor), name)
        return tensor

    return collective("scatter", group, codec, check, body, async_op, tensor)


def all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor], group=None,
               codec=DEFAULT_CODEC, async_op: bool = False):
    """Rank r sends input_list[j] to rank j; each part is compressed once (GPU: on its own stream),
    and all parts travel at once (sizes first)."""

    def check():
        w = T.world(group)
        check_count(input_list, w, "all_to_all", "inputs")
        check_count(output_list, w, "all_to_all", "outputs")
        # the ranks agree on every size, so what rank j sends rank r (its input r) is this rank's input r's size
        check_sizes([*input_list, *output_list], "all_to_all")
        for t in output_list:
            flat(t)
        row = row_length(codec, [*input_list, *output_list], "all_to_all")
        key, name = settings([*input_list, *output_list], "sum", codec, "auto", "all_to_all", row=row)
        return key, (w, name, row), input_list

    def body(found):
        w, name, row = found
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

    return collective("all_to_all", group, codec, check, body, async_op, output_list[0] if output_list else None)
