"""What the functional collectives and the plans share: this rank's argument checks, the agreement
every call starts with, and call ordering (one background thread per process for asynchronous calls).

A call fails together or not at all: each rank first runs its own checks (op, dtype, contiguity,
counts and sizes, codec settings, roots, and, where the call runs, the values an error-bounded codec
refuses: NaN or Inf, steps beyond int32), then every rank meets in one small all_gather (``agree``)
of its settings and whether its checks refused the call, with the reason, before any compressed
step.  A rank whose checks failed raises its own error there; the others raise ``PeerFailedError``
naming it and its reason; ranks whose settings differ all raise ``PlanMismatchError``.  So an argument wrong on one
rank is raised on every rank as soon as all have called, whatever the group's timeout.  With no
process group there is no one to tell, and a refused call raises at once.  (One refusal is left to
the encoder, on its own rank, after the agreement: a Lorenzo residual beyond int32, which only a
tensor with steps beyond 2**29, values beyond 2**30 eb, can give.)

Calls run in the order they are made, on every rank: an ``async_op=True`` call runs on this
process's one background thread (on the caller's CUDA device and stream), and a later call,
asynchronous or not, queues behind it while it is pending.  An asynchronous call returns a
``Handle``, a ``torch.futures.Future`` of its result (``then``, ``wait``, ``value`` as torch's own).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist

from .. import defaults
from ..config import whole_number
from ..errors import InvalidArgumentError, PeerFailedError, UnsupportedFormatError, VisemzError
from ..floats import ErrorBounded, Lossless
from ..floats.dtypes import FLOATS
from ..floats.error_bounded import predicts_rows
from ..floats.prediction import PREDICTORS
from . import transport as T

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
        codec.__post_init__()  # the codec's own checks again: a bound changed after construction is refused here
        return [1.0, float(codec.eb), float(PREDICTORS.index(codec.predictor))]
    if isinstance(codec, Lossless):
        return [2.0, 0.0, 0.0]
    raise InvalidArgumentError(f"codec={codec!r}: expected ErrorBounded(eb), Lossless() or None")


def algorithm_code(algorithm: str) -> int:
    """``algorithm``'s index in ALGORITHMS (a setting every rank agrees on); InvalidArgumentError naming it if it
    is none of them."""
    if algorithm not in ALGORITHMS:
        raise InvalidArgumentError(f"algorithm={algorithm!r}: expected one of {list(ALGORITHMS)}")
    return ALGORITHMS.index(algorithm)


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "scatter", "all_to_all")
KEY_FIELDS = ("collective", "op", "dtype", "codec", "eb", "predictor", "algorithm or root", "tensors", "values",
              "sizes hash", "row length (2-D prediction)", "compressed on a GPU",
              "in-band KiB (VISEMZ_COLLECTIVE_INBAND_KIB)")


def settings(tensors, op: str, codec, algorithm: str, what: str, extra: int = -1,
             row: int = 0) -> tuple[list[float], str]:
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
           float(extra), float(len(sizes)), float(sum(sizes)),
           float(hash(sizes) & (2**52 - 1)),  # ints hash alike in every process
           float(row), float(on_gpu), float(defaults.get("collective_inband_kib") if on_gpu else 0)]
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
        raise InvalidArgumentError(f"{what} with {codec!r}: 2-D Lorenzo prediction runs along rows of the tensors' "
                                   "last dimension, so every tensor needs 2 or more dimensions and the same last one; "
                                   f"got shapes {list(dict.fromkeys(shapes))}")
    return codec.prediction(shapes[0]).row


def flat(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise InvalidArgumentError("collectives work in place on contiguous tensors: got one of shape "
                                   f"{tuple(t.shape)} with strides {t.stride()}")
    return t.view(-1)


def check_count(tensors, w: int, what: str, which: str) -> None:
    """InvalidArgumentError unless ``tensors`` is a list of one tensor per rank of a group of ``w``."""
    if tensors is None or len(tensors) != w:
        got = 0 if tensors is None else len(tensors)
        raise InvalidArgumentError(f"{what} needs {w} {which} (one per rank), got {got}")


def check_sizes(tensors, what: str) -> None:
    """InvalidArgumentError unless every tensor of ``tensors`` holds as many values as the first (what one
    rank sends is what another receives)."""
    sizes = [t.numel() for t in tensors]
    if len(set(sizes)) > 1:
        raise InvalidArgumentError(f"{what}: every tensor must hold the same number of values, got {sizes}")


def check_root(src, w: int, what: str) -> int:
    """``src`` as a rank of a group of ``w``; InvalidArgumentError naming it if it is not one."""
    if not whole_number(src) or not 0 <= src < w:
        raise InvalidArgumentError(f"{what}: src={src!r} is not a rank of this group (0 to {w - 1})")
    return int(src)


def check_values(tensors, codec) -> None:
    """What an error-bounded codec refuses in the values it is to compress (NaN or Inf, steps of 2 eb that
    int32 cannot hold), raised with the codec's own error from the largest magnitude of ``tensors``: one
    reduction per tensor and one host read (on a GPU, after the work queued on the stream), so that it is
    found before any compressed step."""
    if not isinstance(codec, ErrorBounded):
        return
    tops = [torch.aminmax(t.detach().reshape(-1)) for t in tensors if t.numel()]
    if tops:  # aminmax and maximum carry NaN through
        top = torch.stack([torch.maximum(hi, -lo).double() for lo, hi in tops]).max()
        codec.quantize_values(np.array([float(top)]))


def agree(key: list[float] | None, group, what: str, failure: Exception | None = None) -> None:
    """Meet every rank of ``group`` in the agreement (``transport.agree``) with this rank's settings ``key``
    (``settings``'s, named by KEY_FIELDS), or with ``failure``, what its own checks raised (``key`` None).
    Then raise: ``failure`` on the rank that met it; ``PeerFailedError`` naming each refusing rank and its
    reason on the others; ``PlanMismatchError`` on every rank when none refused and the settings differ."""
    reason = None if failure is None else f"{type(failure).__name__}: {failure}"
    try:
        with peer_failures(what):
            refused = T.agree(key if key is not None else [0.0] * len(KEY_FIELDS), group, f"{what} settings",
                              KEY_FIELDS, reason)
    except Exception as e:
        if failure is None:
            raise
        raise failure from e  # the group could not be told (a bad group, a dead peer): this rank's own error first
    if failure is not None:
        raise failure
    if refused:
        said = "; ".join(f"rank {r}: {text}" for r, text in sorted(refused.items()))
        raise PeerFailedError(f"{what}: another rank of the group refused the call ({said})")


def collective(what: str, group, codec, check, body, async_op: bool, like=None):
    """One collective call: ``check()``, this rank's argument checks (returns the settings key, what
    ``body`` needs, and the tensors whose values ``codec`` is to compress; raises what is wrong here);
    then, in call order, those values' check (``check_values``: on the thread that runs the call, so an
    asynchronous call never waits for the device here), the agreement (``agree``) and ``body(needs)``,
    torch.distributed's reports of a failed peer raised as ``PeerFailedError``.  ``like``: a tensor of
    the call, whose CUDA device an asynchronous call's Future is made for.

    A refused argument is raised after the agreement has told the other ranks (an asynchronous call raises
    it at once, its agreement queued to tell them), or at once where there is no process group to tell."""
    try:
        key, needs, values = check()
        failure = None
    except Exception as e:
        if not (dist.is_available() and dist.is_initialized()):
            raise
        key, needs, values, failure = None, None, [], e

    def work():
        refused = failure
        if refused is None:
            try:
                check_values(values, codec)
            except Exception as e:
                refused = e
        agree(None if refused else key, group, what, refused)
        with peer_failures(what):
            return body(needs)

    result = run(work, async_op, getattr(like, "device", None))
    if failure is not None:  # asynchronous: the queued agreement tells the others
        raise failure
    return result


class Handle(torch.futures.Future):
    """What ``async_op=True`` returns: a ``torch.futures.Future`` of the call's result, set when the call is
    done (``then`` chains on it, as DDP's hooks do; for a CUDA tensor it is made for its device, so
    ``wait`` and ``value`` order the waiting stream after the call's work).  ``wait(timeout)`` blocks until
    done, at most ``timeout`` seconds (``TimeoutError`` after), and re-raises any error of the call;
    ``is_completed`` and ``get_future`` are torch's ``Work``'s."""

    def __init__(self, device: torch.device | None = None):
        super().__init__(devices=[device] if device is not None and device.type == "cuda" else None)
        self._finished = threading.Event()

    def complete_with(self, fn) -> None:
        """Run ``fn`` and set its result or its error (on the thread that runs the call)."""
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 (the Future carries any error to its waiter)
            self.set_exception(e)
        else:
            self.set_result(result)
        finally:
            self._finished.set()

    def wait(self, timeout: float | None = None):
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the collective did not finish within {timeout} s")
        return super().wait()

    def is_completed(self) -> bool:
        return self.done()

    def get_future(self) -> "Handle":
        return self


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


def run(fn, async_op: bool, device: torch.device | None = None):
    """Run now, or on this process's one background thread: asynchronous calls, and any call
    made while an earlier one is still queued there (so every rank runs them in call order).
    Asynchronous: a ``Handle`` (``device``: the call's tensors', for a CUDA Future)."""
    global _EXECUTOR, _QUEUED
    handle = Handle(device) if async_op else None
    with _LOCK:
        behind = _QUEUED is not None and not _QUEUED.done()
        if async_op or behind:
            if _EXECUTOR is None:
                _EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="visemz-collectives")
            # a Future's result is set inside the caller's stream context: a CUDA Future records it there
            _QUEUED = _EXECUTOR.submit(_in_callers_context(fn if handle is None else lambda: handle.complete_with(fn)))
            queued = _QUEUED
    if async_op:
        return handle
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


