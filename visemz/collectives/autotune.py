"""``all_reduce(algorithm="auto")``: calibrate once per group and codec setting, then choose per call.

Calibration runs at the first ``auto`` call of a setting (group, error bound, dtype): every
candidate (plain, ring, recursive doubling) is timed for real on the call's device at two
sizes (``VISEMZ_COLLECTIVE_CALIBRATION_KIB``, default 1 MiB and 256 MiB on a GPU, the larger
above the GPU's L2 cache; CPU tensors, whose codecs run in NumPy, use 1/64 of these), on the call's own values tiled to
those sizes, so the codec sees the data it will compress.  Each timing is the median of
``REPS`` runs after a warm-up.  The table of timings is max-reduced over the group once (the
slowest rank's figures: every rank then holds the same numbers), and ``cost.CostModel``
fits one line per algorithm and splits the compressed ones' per-byte cost into codec work
and wire bytes.

Each compressed all_reduce then records the ratio of its final payloads (``observe``), which
are the same bytes on every rank (``algorithms.py``), and the next ``auto`` call of that
setting re-estimates with it.  Every rank therefore holds the same model and the same ratio
and makes the same choice, with no communication per call.  When ``auto`` keeps choosing
plain, no new ratio is observed: the last one stands.  ``use_model`` installs a model measured
elsewhere (every rank alike) or drops one so the next call calibrates again.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import config, defaults, measure
from ..floats.error_bounded import ErrorBounded, predicts_rows
from . import algorithms as A
from . import transport as T
from .cost import ALGORITHMS, CostModel
from .engines import engine_for

REPS = 3  # timed runs per algorithm and size, after one warm-up; the median counts
HOST_SCALE = 64  # NumPy codecs run at about 1/100 of a GPU's speed: CPU calibrations use smaller sizes


@dataclass
class _GroupState:
    models: dict = field(default_factory=dict)  # (eb, dtype) -> CostModel
    # (eb, dtype) -> ratio of the last compressed all_reduce's final payloads
    ratios: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)  # (eb, dtype) -> wall time its calibration took on this rank


# Weak keys: holding a process group would keep it alive past destroy_process_group into interpreter
# exit (Gloo then aborts there), and a group created later is a new key, so it is calibrated anew.
_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state(group, codec, dtype: str) -> tuple[_GroupState, tuple]:
    pg = group if group is not None else dist.group.WORLD
    return _GROUPS.setdefault(pg, _GroupState()), (float(codec.eb), dtype)


def calibration_bytes(device: torch.device) -> tuple[int, int]:
    """The two calibration sizes in bytes for tensors on ``device``."""
    kib = config.calibration_kib(defaults.get("collective_calibration_kib"))  # checked when it was set
    scale = 1 if device.type == "cuda" else HOST_SCALE
    return kib[0] * 1024 // scale, kib[1] * 1024 // scale


def prepare(flat: torch.Tensor, codec, dtype: str, group) -> CostModel:
    """The setting's model, calibrated on ``flat``'s values first if there is none yet (a
    collective: every rank calls it at the same point, e.g. before timing a call)."""
    state, key = _state(group, codec, dtype)
    if key not in state.models:
        t0 = time.perf_counter()
        state.models[key] = calibrate(flat, codec, dtype, group)
        state.seconds[key] = time.perf_counter() - t0
    return state.models[key]


class Chooser:
    """The algorithm for a plan's error-bounded all_reduce calls (tensors of ``nbytes``): called with the
    call's flat tensor, on every rank in the same order of calls (the first call may calibrate).

    The setting's state is looked up once, and the last answer is kept while the model (the same object)
    and the observed ratio stay as they were: they change only by ``observe``, ``use_model`` or a new
    calibration, so a call that keeps its choice costs two dictionary reads (the host time of
    a small all_reduce that ``auto`` sends to plain NCCL)."""

    def __init__(self, group, codec, dtype: str, nbytes: int):
        self.group, self.codec, self.dtype, self.nbytes = group, codec, dtype, nbytes
        self.state, self.key = _state(group, codec, dtype)
        self._inputs: tuple | None = None  # (model, ratio) of the last answer
        self._chosen = ""

    def __call__(self, flat: torch.Tensor) -> str:
        m = self.state.models.get(self.key) or prepare(flat, self.codec, self.dtype, self.group)
        ratio = self.state.ratios.get(self.key)
        if self._inputs is None or self._inputs[0] is not m or self._inputs[1] != ratio:
            self._inputs, self._chosen = (m, ratio), m.choose(self.nbytes, ratio)
        return self._chosen


def observe(group, codec, dtype: str, nbytes: int, payload_bytes: int) -> None:
    """Record the ratio of a compressed all_reduce's final payloads (the same on every rank)."""
    state, key = _state(group, codec, dtype)
    state.ratios[key] = nbytes / max(payload_bytes, 1)


def model(group, codec, dtype: str) -> tuple[CostModel, float | None] | None:
    """The model of a setting and its last observed ratio (None before calibration)."""
    state, key = _state(group, codec, dtype)
    return (state.models[key], state.ratios.get(key)) if key in state.models else None


def calibration_seconds(group, codec, dtype: str) -> float | None:
    """How long this rank spent calibrating the setting (None if it was not calibrated here)."""
    state, key = _state(group, codec, dtype)
    return state.seconds.get(key)


def use_model(group, codec, dtype: str, m: CostModel | None) -> None:
    """Choose with ``m`` for this setting from now on (e.g. one measured earlier), or with None
    calibrate again at the next auto call.  Every rank must do the same."""
    state, key = _state(group, codec, dtype)
    if m is None:
        state.models.pop(key, None)
    else:
        state.models[key] = m


def calibrate(flat: torch.Tensor, codec, dtype: str, group) -> CostModel:
    """Time every candidate on this group; every rank must call it (it communicates)."""
    small, big = calibration_bytes(flat.device)
    elem = flat.element_size()
    counts = (max(small // elem, 1), max(big // elem, 2))
    src = _tiled(flat, counts[1])
    if predicts_rows(codec):  # tiled copies have no rows: time 1-D Lorenzo
        codec = ErrorBounded(codec.eb, "lorenzo")
    eng = engine_for(flat, codec)
    seconds: dict[str, list[float]] = {a: [] for a in ALGORITHMS}
    payload = 1
    with A.phase_times_paused():
        for k in counts:
            part, buf = src[:k], torch.empty_like(src[:k])
            for a in ALGORITHMS:
                t, out = _median_seconds(lambda a=a, buf=buf: _run(a, eng, buf, group, dtype),
                                         lambda buf=buf, part=part: buf.copy_(part))
                seconds[a].append(t)
                payload = out or payload  # the compressed algorithms' final payload bytes
    ratio = counts[1] * elem / payload  # of the last compressed run at the larger size
    table = torch.tensor([t for a in ALGORITHMS for t in seconds[a]] + [-ratio], dtype=torch.float64)
    table = table.to(T.device(group))
    dist.all_reduce(table, op=dist.ReduceOp.MAX, group=group)  # slowest rank's times; ratio is the same everywhere
    v = table.tolist()
    timings = {a: (v[2 * i], v[2 * i + 1]) for i, a in enumerate(ALGORITHMS)}
    return CostModel.from_timings(T.world(group), (counts[0] * elem, counts[1] * elem), timings, -v[-1])


def _tiled(flat: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` values: the tensor's own, repeated as often as needed."""
    reps = -(-n // max(flat.numel(), 1))
    return (flat.repeat(reps) if reps > 1 else flat)[:n].clone()


def _run(algorithm: str, eng, buf: torch.Tensor, group, dtype: str) -> int:
    """One all_reduce of ``buf`` in place; the compressed ones' final payload bytes (plain: 0)."""
    if algorithm == "plain":
        dist.all_reduce(buf, group=group)
        return 0
    total, payload = A.COMPRESSED[algorithm](eng, buf, group, dtype)
    A.write_values(buf, total)
    return payload


def _median_seconds(run, reset) -> tuple[float, int]:
    """Median of REPS timed runs after a warm-up (communicators, kernels, allocator); ``reset``
    restores the input before each run, untimed, so every run sums the same values."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return measure.median_seconds(run, REPS, warmup=1, sync=sync, reset=reset)
