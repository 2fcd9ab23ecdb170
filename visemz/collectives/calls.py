"""What the functional collectives and the plans share: argument checks, the settings every rank
must agree on, and call ordering (one background thread per process for asynchronous calls).

Calls run in the order they are made, on every rank: an ``async_op=True`` call runs on this
process's one background thread (on the caller's CUDA device and stream), and a later call,
asynchronous or not, queues behind it while it is pending.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist

from ..config import DEFAULTS
from ..errors import InvalidArgumentError, PeerFailedError, UnsupportedFormatError, VisemzError
from . import transport as T
from .codecs import FLOATS, PREDICTORS, ErrorBounded, Lossless, predicts_rows

OPS = ("sum", "avg")
ALGORITHMS = ("auto", "ring", "recursive_doubling", "plain")
DEFAULT_CODEC = ErrorBounded(1e-4)  # frozen, so one shared default is safe
# What a peer that died, closed or reset its connection, or let a wait run out of time, looks like:
# torch.distributed's network failures by type, and by their text the plain RuntimeError Gloo raises
# ("Connection closed by peer [...]", "Timed out waiting 20000ms for recv operation to complete",
# "Application timeout caused pair closure") and NCCL's DistBackendError ("... ran for 120000
# milliseconds before timing out", "NCCL communicator was aborted", "remote process exited").  Any
# other error, one naming Gloo or NCCL for a bad tensor included, is not a peer's failure.
_PEER_FAILURE_TYPES = (dist.DistNetworkError,)
_PEER_FAILURE_TEXT = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "timeout",
                      "timing out", "communicator was aborted", "remote process exited")
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# ------------------------------------------------------------------ helpers
def dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in _DTYPES:
        raise UnsupportedFormatError(f"tensor dtype {t.dtype} is not one of {list(FLOATS)}")
    return _DTYPES[t.dtype]


def _codec_key(codec) -> list[float]:
    """codec kind, eb, predictor code."""
    if codec is None:
        return [0.0, 0.0, 0.0]
    if isinstance(codec, ErrorBounded):
        return [1.0, float(codec.eb), float(PREDICTORS.index(codec.predictor))]
    if isinstance(codec, Lossless):
        return [2.0, 0.0, 0.0]
    raise InvalidArgumentError(f"codec={codec!r}: expected ErrorBounded(eb), Lossless() or None")


def algorithm_code(algorithm: str) -> int:
    """``algorithm``'s index in ALGORITHMS (a setting every rank agrees on); InvalidArgumentError naming it if it is none of them."""
    if algorithm not in ALGORITHMS:
        raise InvalidArgumentError(f"algorithm={algorithm!r}: expected one of {list(ALGORITHMS)}")
    return ALGORITHMS.index(algorithm)


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "scatter", "all_to_all")
KEY_FIELDS = ("collective", "op", "dtype", "codec", "eb", "predictor", "algorithm or root", "tensors", "values", "sizes hash",
              "row length (2-D prediction)", "compressed on a GPU", "in-band KiB (VISEMZ_COLLECTIVE_INBAND_KIB)")


def settings(tensors, op: str, codec, algorithm: str, what: str, extra: int = -1, row: int = 0) -> tuple[list[float], str]:
    """Check the arguments on this rank; the settings every rank must share, and the dtype name.

    The settings are a fixed number of floats whatever the collective and the number of tensors
    (the sizes enter as their count, their total and a hash), so that ranks calling different
    collectives, or passing lists of different lengths, still meet in an agreement of one shape
    and are refused there instead of hanging."""
    if op not in OPS:
        raise InvalidArgumentError(f"op={op!r}: expected one of {list(OPS)}")
    algorithm_code(algorithm)
    names = {dtype_name(t) for t in tensors}
    if len(names) != 1:
        raise InvalidArgumentError(f"{what}: tensors mix dtypes {sorted(names)}")
    name = names.pop()
    sizes = tuple(t.numel() for t in tensors)
    # the engine and the in-band limit decide the wire protocol of a compressed call (device streams or host
    # bytes; in-band or sized steps): ranks that differ would misread each other, so they are settings too
    on_gpu = codec is not None and tensors[0].is_cuda
    key = [float(COLLECTIVES.index(what)), float(OPS.index(op)), float(list(FLOATS).index(name)), *_codec_key(codec),
           float(extra), float(len(sizes)), float(sum(sizes)), float(hash(sizes) & (2**52 - 1)),  # ints hash alike in every process
           float(row), float(on_gpu), float(DEFAULTS.collective_inband_kib if on_gpu else 0)]
    return key, name


def row_length(codec, tensors, what: str) -> int:
    """lorenzo2d's row length for a call on ``tensors`` (else 0): their last dimension, which they must
    all share, because flat payloads carry no shape and every rank decodes with this one length (a
    setting the ranks agree on).  InvalidArgumentError, naming the codec and the collective, for a
    tensor of fewer than 2 dimensions or tensors whose last dimensions differ."""
    if not predicts_rows(codec):
        return 0
    shapes = [tuple(t.shape) for t in tensors]
    if any(len(s) < 2 for s in shapes) or len({s[-1] for s in shapes}) != 1:
        raise InvalidArgumentError(f"{what} with {codec!r}: 2-D Lorenzo prediction runs along rows of the tensors' last "
                                   "dimension, so every tensor needs 2 or more dimensions and the same last one; got "
                                   f"shapes {list(dict.fromkeys(shapes))}")
    return codec.prediction(shapes[0]).row


def agree(key: list[float], group, what: str) -> None:
    """Raise ``PlanMismatchError`` on every rank when ranks disagree on ``key`` (``settings``'s, named by KEY_FIELDS)."""
    with peer_failures(what):
        T.agree(key, group, f"{what} settings", KEY_FIELDS)


def flat(t: torch.Tensor) -> torch.Tensor:
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


def run(fn, async_op: bool):
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


class peer_failures:
    """Turn the transport's reports of a peer that died, closed its connection or timed out into
    ``PeerFailedError`` naming the collective, the transport's error chained as its cause; every
    other error passes through unchanged."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is not None and _peer_failure(err):
            raise PeerFailedError(f"{self.what}: another rank of the group failed, left or timed out ({err})") from err
        return False


def _peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is the transport's report of a dead, disconnected or stalled peer
    (``_PEER_FAILURE_TYPES`` / ``_PEER_FAILURE_TEXT``); a CUDA, shape or argument error stays what it is."""
    if isinstance(err, VisemzError) or not isinstance(err, RuntimeError):
        return False
    text = str(err).lower()
    return isinstance(err, _PEER_FAILURE_TYPES) or any(w in text for w in _PEER_FAILURE_TEXT)


_LAST = threading.local()


def set_last_algorithm(name: str) -> None:
    _LAST.algorithm = name


def last_algorithm() -> str | None:
    """The algorithm the last all_reduce on this thread ran ("plain", "ring", "recursive_doubling",
    or "gather" for lossless): what ``auto`` chose.  Asynchronous calls record it on the background thread."""
    return getattr(_LAST, "algorithm", None)


