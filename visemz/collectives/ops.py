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

CUDA tensors are compressed, added and decoded on their GPU (``engines.DeviceEngine``) and on
an NCCL group the compressed bytes move GPU to GPU; CPU tensors use the NumPy codecs.  Both
give the same bytes, so the results are the same wherever the work runs.

Calls run in the order they are made, on every rank: an ``async_op=True`` call runs on this
process's one background thread (on the caller's CUDA device and stream), and a later call,
asynchronous or not, queues behind it while it is pending.  The settings agreement runs inside
that order too, so a mismatch in an asynchronous call is raised by its ``wait()``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError, UnsupportedFormatError
from . import autotune
from . import transport as T
from .algorithms import (
    COMPRESSED,
    phase,
    phase_times,
    ring_reduce_scatter,
    write_values,
)
from .codecs import FLOATS, ErrorBounded, Lossless
from .cost import CostModel
from .engines import engine_for

__all__ = ["ALGORITHMS", "OPS", "CostModel", "Handle", "all_gather", "all_reduce", "all_to_all",
           "broadcast", "last_algorithm", "phase_times", "reduce_scatter", "scatter"]

OPS = ("sum", "avg")
ALGORITHMS = ("auto", "ring", "recursive_doubling", "plain")
DEFAULT_CODEC = ErrorBounded(1e-4)  # frozen, so one shared default is safe
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# ------------------------------------------------------------------ helpers
def _dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in _DTYPES:
        raise UnsupportedFormatError(f"tensor dtype {t.dtype} is not one of {list(FLOATS)}")
    return _DTYPES[t.dtype]


def _codec_key(codec) -> list[float]:
    if codec is None:
        return [0.0, 0.0]
    if isinstance(codec, ErrorBounded):
        return [1.0, float(codec.eb)]
    if isinstance(codec, Lossless):
        return [2.0, 0.0]
    raise InvalidArgumentError(f"codec={codec!r}: expected ErrorBounded(eb), Lossless() or None")


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "scatter", "all_to_all")
_KEY_FIELDS = "collective, op, dtype, codec, eb, algorithm or root, tensors, values, sizes hash"


def _settings(tensors, op: str, codec, algorithm: str, what: str, extra: int = -1) -> tuple[list[float], str]:
    """Check the arguments on this rank; the settings every rank must share, and the dtype name.

    The settings are a fixed number of floats whatever the collective and the number of tensors
    (the sizes enter as their count, their total and a hash), so that ranks calling different
    collectives, or passing lists of different lengths, still meet in an agreement of one shape
    and are refused there instead of hanging."""
    if op not in OPS:
        raise InvalidArgumentError(f"op={op!r}: expected one of {list(OPS)}")
    if algorithm not in ALGORITHMS:
        raise InvalidArgumentError(f"algorithm={algorithm!r}: expected one of {list(ALGORITHMS)}")
    names = {_dtype_name(t) for t in tensors}
    if len(names) != 1:
        raise InvalidArgumentError(f"{what}: tensors mix dtypes {sorted(names)}")
    name = names.pop()
    sizes = tuple(t.numel() for t in tensors)
    key = [float(COLLECTIVES.index(what)), float(OPS.index(op)), float(list(FLOATS).index(name)), *_codec_key(codec),
           float(extra), float(len(sizes)), float(sum(sizes)), float(hash(sizes) & (2**52 - 1))]  # ints hash alike in every process
    return key, name


def _agree(key: list[float], group, what: str) -> None:
    T.agree(key, group, f"{what} settings ({_KEY_FIELDS})")


def _flat(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise InvalidArgumentError("collectives work in place on contiguous tensors")
    return t.view(-1)



class Handle:
    """What ``async_op=True`` returns: ``wait()`` blocks until done and re-raises any error."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self, timeout: float | None = None):
        return self._future.result(timeout)

    def is_completed(self) -> bool:
        return self._future.done()


_EXECUTOR: ThreadPoolExecutor | None = None
_QUEUED: Future | None = None  # the last call handed to the background thread
_LOCK = threading.Lock()


def _in_callers_context(fn):
    """``fn`` to run on another thread with the caller's current CUDA device and stream (a new
    thread starts on device 0 and the default stream: another rank's GPU, unordered work)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return fn
    stream = torch.cuda.current_stream()

    def run():
        with torch.cuda.device(stream.device), torch.cuda.stream(stream):
            return fn()

    return run


def _run(fn, async_op: bool):
    """Run now, or on this process's one background thread: asynchronous calls, and any call
    made while an earlier one is still queued there (so every rank runs them in call order)."""
    global _EXECUTOR, _QUEUED
    with _LOCK:
        behind = _QUEUED is not None and not _QUEUED.done()
        if async_op or behind:
            if _EXECUTOR is None:
                _EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="visemz-collectives")
            _QUEUED = _EXECUTOR.submit(_in_callers_context(fn))
            queued = _QUEUED
    if async_op:
        return Handle(queued)
    return queued.result() if behind else fn()


_LAST = threading.local()


def last_algorithm() -> str | None:
    """The algorithm the last all_reduce on this thread ran ("plain", "ring", "recursive_doubling",
    or "gather" for lossless): what ``auto`` chose.  Asynchronous calls record it on the background thread."""
    return getattr(_LAST, "algorithm", None)


# ---------------------------------------------------------------- all_reduce
def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, codec=DEFAULT_CODEC,
               algorithm: str = "auto", async_op: bool = False):
    """Reduce ``tensor`` across ranks in place (compressed unless codec is None or algorithm 'plain')."""
    flat = _flat(tensor)
    key, name = _settings([tensor], op, codec, algorithm, "all_reduce", ALGORITHMS.index(algorithm))
    w = T.world(group)

    def work():
        _agree(key, group, "all_reduce")
        chosen = _resolve(algorithm, codec, flat, name, group)
        _LAST.algorithm = chosen
        if chosen == "plain":
            dist.all_reduce(tensor, group=group)
            if op == "avg":
                tensor.div_(w)
            return tensor
        eng = engine_for(flat, codec)
        if chosen == "gather":
            total = _lossless_sum(eng, flat, group, name)
        else:
            total, payload = COMPRESSED[chosen](eng, flat, group, name)
            autotune.observe(group, codec, name, flat.numel() * flat.element_size(), payload)
        write_values(flat, total / w if op == "avg" else total)
        return tensor

    return _run(work, async_op)


def _resolve(algorithm: str, codec, flat: torch.Tensor, name: str, group) -> str:
    if codec is None or algorithm == "plain" or T.world(group) == 1:
        return "plain"
    if isinstance(codec, Lossless):
        return "gather"
    if algorithm != "auto":
        return algorithm
    return autotune.choose(flat, codec, name, group) if flat.numel() else "plain"


def _lossless_sum(eng, flat: torch.Tensor, group, name: str) -> torch.Tensor:
    """Gathered and summed in float64 in rank order: the same on every rank."""
    n = flat.numel()
    with phase("compress"):
        mine = eng.encode_many([flat])[0]
    with phase("communicate"):
        got = T.all_gather(mine, group)
    with phase("decompress"):
        return sum(eng.values(p, n, name) for p in got)


# ------------------------------------------------------------ reduce_scatter
def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: str = "sum", group=None,
                   codec=DEFAULT_CODEC, async_op: bool = False):
    """output on rank r = reduction over ranks of input_list[r]."""
    w = T.world(group)
    if len(input_list) != w:
        raise InvalidArgumentError(f"reduce_scatter needs {w} inputs (one per rank), got {len(input_list)}")
    key, name = _settings([output, *input_list], op, codec, "auto", "reduce_scatter")
    out = _flat(output)

    def work():
        _agree(key, group, "reduce_scatter")
        r = T.rank(group)
        if codec is None:
            stacked = torch.cat([t.reshape(-1) for t in input_list])
            dist.all_reduce(stacked, group=group)
            a = r * out.numel()
            out.copy_(stacked[a : a + out.numel()] / (w if op == "avg" else 1))
            return output
        eng, n = engine_for(out, codec), out.numel()
        mine = eng.encode_many([t.reshape(-1) for t in input_list])
        if isinstance(codec, Lossless):  # every rank's part r, summed in rank order
            got = T.exchange({j: mine[j] for j in range(w) if j != r}, [j for j in range(w) if j != r], group)
            total = sum(eng.values(mine[j] if j == r else got[j], n, name) for j in range(w))
        else:
            total = eng.values(ring_reduce_scatter(eng, mine, [n] * w, group), n, name)
        write_values(out, total / w if op == "avg" else total)
        return output

    return _run(work, async_op)


# --------------------------------------------------- data-movement collectives
def _decode_into(eng, payload: torch.Tensor, out: torch.Tensor, name: str) -> None:
    write_values(out, eng.values(payload, out.numel(), name))


def _moved(op: str, key, group, codec, like: torch.Tensor, plain, compressed, async_op: bool):
    """Run a data-movement collective: agree on the settings, then ``plain()`` (torch.distributed's
    own) when codec is None, else ``compressed(engine)``."""

    def work():
        _agree(key, group, op)
        return plain() if codec is None else compressed(engine_for(like, codec))

    return _run(work, async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group=None, codec=DEFAULT_CODEC,
               async_op: bool = False):
    w = T.world(group)
    if len(tensor_list) != w:
        raise InvalidArgumentError(f"all_gather needs {w} outputs (one per rank), got {len(tensor_list)}")
    key, name = _settings([tensor, *tensor_list], "sum", codec, "auto", "all_gather")

    def plain():
        dist.all_gather(tensor_list, tensor, group)
        return tensor_list

    def compressed(eng):
        for out, p in zip(tensor_list, T.all_gather(eng.encode_many([_flat(tensor)])[0], group)):
            _decode_into(eng, p, _flat(out), name)
        return tensor_list

    return _moved("all_gather", key, group, codec, tensor, plain, compressed, async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, codec=DEFAULT_CODEC, async_op: bool = False):
    key, name = _settings([tensor], "sum", codec, "auto", "broadcast", src)

    def plain():
        dist.broadcast(tensor, src, group)
        return tensor

    def compressed(eng):
        mine = eng.encode_many([_flat(tensor)])[0] if T.rank(group) == src else None
        _decode_into(eng, T.broadcast(mine, src, group), _flat(tensor), name)
        return tensor

    return _moved("broadcast", key, group, codec, tensor, plain, compressed, async_op)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int, group=None,
            codec=DEFAULT_CODEC, async_op: bool = False):
    """The root compresses each part once (GPU: each on its own stream) and sends them all at once
    (sizes first)."""
    r, w = T.rank(group), T.world(group)
    if r == src and (scatter_list is None or len(scatter_list) != w):
        raise InvalidArgumentError(f"scatter's root needs a list of {w} tensors")
    key, name = _settings([tensor], "sum", codec, "auto", "scatter", src)

    def plain():
        dist.scatter(tensor, scatter_list if r == src else None, src, group)
        return tensor

    def compressed(eng):
        if r == src:
            parts = eng.encode_many([_flat(t.contiguous()) for t in scatter_list])
            T.exchange({i: p for i, p in enumerate(parts) if i != src}, [], group)
            _decode_into(eng, parts[src], _flat(tensor), name)
        else:
            _decode_into(eng, T.exchange({}, [src], group)[src], _flat(tensor), name)
        return tensor

    return _moved("scatter", key, group, codec, tensor, plain, compressed, async_op)


def all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor], group=None,
               codec=DEFAULT_CODEC, async_op: bool = False):
    """Rank r sends input_list[j] to rank j; each part is compressed once (GPU: on its own stream),
    and all parts travel at once (sizes first)."""
    w = T.world(group)
    if len(output_list) != w or len(input_list) != w:
        raise InvalidArgumentError(f"all_to_all needs {w} inputs and {w} outputs")
    key, name = _settings([*input_list, *output_list], "sum", codec, "auto", "all_to_all")

    def work():
        _agree(key, group, "all_to_all")
        r = T.rank(group)
        if codec is None and T.device(group).type == "cuda":
            dist.all_to_all(output_list, [t.contiguous() for t in input_list], group)
            return output_list
        # Gloo has no all_to_all: the uncompressed path there is the exact (lossless) exchange
        eng = engine_for(input_list[0], codec if codec is not None else Lossless())
        parts = eng.encode_many([_flat(t.contiguous()) for t in input_list])
        others = [j for j in range(w) if j != r]
        got = T.exchange({j: parts[j] for j in others}, others, group)
        _decode_into(eng, parts[r], _flat(output_list[r]), name)
        for j in others:
            _decode_into(eng, got[j], _flat(output_list[j]), name)
        return output_list

    return _run(work, async_op)
