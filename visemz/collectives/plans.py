"""Persistent all_reduce plans: settings agreed across ranks once, everything per-call made once.

    p = visemz.collectives.plan(tensor, op="sum", group=None, codec=ErrorBounded(1e-4), algorithm="auto")
    p(tensor)                 # in place, like all_reduce(tensor, ...); p(tensor, async_op=True) -> Handle

Making a plan is collective: every rank of the group makes it with its own tensor, and the
settings (collective, op, dtype, codec, eb, predictor, algorithm, element count, 2-D row length)
are agreed then, once (``calls.collective``).  A rank whose settings differ makes every rank raise
``PlanMismatchError``, which names each differing setting and every rank's value of it; a rank whose
own checks refuse its arguments raises that error, and the others ``PeerFailedError`` naming it.
Afterwards a call checks its tensor against the plan on this rank alone (element count, dtype,
device, contiguity) and runs with no agreement: the engine, the chunk bounds of the ring and the
resolved algorithm (``auto`` asks the calibrated cost model, which communicates only when it
calibrates) are the plan's.  So a plan's call does not check its values across ranks: NaN or Inf
in one rank's tensor is raised by that rank's encoder, and the others raise ``PeerFailedError``
only when the group's timeout runs out; the functional ``all_reduce`` checks values in its per-call
agreement.
Every rank must call the plans it made in the same order, as with torch.distributed's own calls.

A rank that dies, leaves or stalls makes the others raise ``PeerFailedError`` (torch.distributed's
error inside), within the group's timeout.

The functional ``all_reduce`` keeps one plan per setting and process group (``plan_for``, a small
LRU cache per process; a new default group after ``destroy_process_group`` gets plans of its own)
and still agrees on each call's settings and values, because a call, unlike a plan, may differ
between ranks; a plan it makes takes that agreement as its own.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError
from ..floats import Lossless
from ..floats.error_bounded import predicts_rows
from . import autotune
from . import transport as T
from .algorithms import COMPRESSED, bounds, phase, write_values
from .calls import (
    DEFAULT_CODEC,
    algorithm_code,
    collective,
    flat,
    peer_failures,
    row_length,
    run,
    set_last_algorithm,
    settings,
)
from .engines import engine_for

CACHE_SIZE = 64  # plans kept for the functional API (each holds an engine and its bounds)


def plan_settings(like: torch.Tensor, op: str, codec, algorithm: str) -> tuple[list[float], tuple[int, str]]:
    """This rank's checks of an all_reduce of tensors like ``like`` (contiguity, op, dtype, codec, algorithm,
    2-D rows): the settings key every rank must share, and (2-D row length, dtype name)."""
    flat(like)
    row = row_length(codec, [like], "all_reduce")
    key, dtype = settings([like], op, codec, algorithm, "all_reduce", algorithm_code(algorithm), row)
    return key, (row, dtype)


class Plan:
    """An all_reduce of tensors like ``like`` over ``group``, made collectively (see the module notes).
    ``agreed``: the ranks have just agreed on these settings (the functional call that makes it)."""

    def __init__(self, like: torch.Tensor, op: str = "sum", group=None, codec=DEFAULT_CODEC, algorithm: str = "auto",
                 agreed: bool = False):
        def check():
            key, found = plan_settings(like, op, codec, algorithm)
            return key, found, []  # no values to check: a plan is made, not run, here

        def setup(found: tuple[int, str]) -> None:
            self._setup(like, op, group, codec, algorithm, *found)

        if agreed:
            setup(check()[1])
        else:  # in call order, like any call: a plan made while an asynchronous call is pending agrees after it
            collective("all_reduce plan", group, codec, check, setup, async_op=False)

    def _setup(self, like: torch.Tensor, op: str, group, codec, algorithm: str, row: int, dtype: str) -> None:
        self.row, self.dtype = row, dtype
        self.op, self.group, self.codec, self.algorithm = op, group, codec, algorithm
        self.n, self.torch_dtype, self.device = like.numel(), like.dtype, like.device
        self.world = T.world(group)
        self.fixed = self._fixed_algorithm()
        self._choose = None if self.fixed else autotune.Chooser(group, codec, self.dtype, self.n * like.element_size())
        self.engine = engine_for(like, codec, self.row) if codec is not None else None
        unit = self.row or 1  # 2-D prediction: ring chunks are whole rows
        self.edges = [(a * unit, b * unit) for a, b in bounds(self.n // unit, self.world)]

    def _fixed_algorithm(self) -> str | None:
        """The algorithm every call runs, or None for ``auto`` on a compressed plan (chosen per call)."""
        if self.codec is None or self.algorithm == "plain" or self.world == 1 or self.n == 0:
            return "plain"
        if isinstance(self.codec, Lossless):
            return "gather"
        return None if self.algorithm == "auto" else self.algorithm

    def check(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the flat view the plan runs on; InvalidArgumentError (on this rank) if it is not the
        plan's kind."""
        if tensor.numel() != self.n or tensor.dtype != self.torch_dtype or tensor.device != self.device:
            raise InvalidArgumentError(f"tensor of {tensor.numel()} {tensor.dtype} on {tensor.device} does not fit "
                                       f"this plan ({self.n} {self.torch_dtype} on {self.device})")
        return flat(tensor)

    def __call__(self, tensor: torch.Tensor, async_op: bool = False):
        values = self.check(tensor)  # on the caller's thread, before the call is queued
        return run(lambda: self._reduce(tensor, values), async_op)

    def run(self, tensor: torch.Tensor) -> torch.Tensor:
        """One all_reduce, now, on this thread (callers order calls: ``calls.run``)."""
        return self._reduce(tensor, self.check(tensor))

    def _reduce(self, tensor: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The all_reduce of ``tensor`` (``values``: its checked flat view)."""
        with peer_failures("all_reduce"):
            chosen = self.fixed or self._choose(values)
            set_last_algorithm(chosen)
            if chosen == "plain":
                dist.all_reduce(tensor, group=self.group)
                if self.op == "avg":
                    tensor.div_(self.world)
                return tensor
            if chosen == "gather":
                total = self._lossless_sum(values)
            else:
                total, payload = COMPRESSED[chosen](self.engine, values, self.group, self.dtype, self.edges)
                autotune.observe(self.group, self.codec, self.dtype, self.n * values.element_size(), payload)
            write_values(values, total / self.world if self.op == "avg" else total)
        return tensor

    def _lossless_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Gathered and summed in float64 in rank order: the same on every rank."""
        with phase("compress"):
            mine = self.engine.encode_many([values])[0]
        with phase("communicate"):
            got = T.all_gather(mine, self.group)
        with phase("decompress"):
            return sum(self.engine.values(p, self.n, self.dtype) for p in got)


def plan(like: torch.Tensor, op: str = "sum", group=None, codec=DEFAULT_CODEC, algorithm: str = "auto") -> Plan:
    """Make an all_reduce plan (collective: every rank of ``group`` calls it)."""
    return Plan(like, op, group, codec, algorithm)


_PLANS: OrderedDict = OrderedDict()
_PLANS_LOCK = threading.Lock()


def _group_key(group) -> weakref.ref:
    """The process group a call runs on, as a cache key: a weak reference to ``group``, or for None to
    the default group now.  After ``destroy_process_group`` and a new ``init_process_group``, None
    means a new group object, so the old group's plans (its world size, chunk bounds, algorithm) are
    never found again.  Weak, so a key keeps no group alive (Gloo aborts at interpreter exit on a
    group kept past ``destroy_process_group``; a default group's plans hold None, not the group),
    and a dead reference equals no live one."""
    T.world(group)  # torch.distributed's own error when there is no such group (no init_process_group yet)
    return weakref.ref(group if group is not None else dist.group.WORLD)


def plan_for(like: torch.Tensor, op: str, group, codec, algorithm: str) -> Plan:
    """The functional API's cached plan of these settings, made if there is none (the calling all_reduce has
    agreed on them: ``plan_settings``' key).  Keyed by everything the plan fixes, the process group included."""
    key = (_group_key(group), op, codec, algorithm, like.numel(), like.dtype, like.device,
           tuple(like.shape) if predicts_rows(codec) else ())
    with _PLANS_LOCK:
        p = _PLANS.get(key)
        if p is not None:
            _PLANS.move_to_end(key)
            return p
    p = Plan(like, op, group, codec, algorithm, agreed=True)
    with _PLANS_LOCK:
        _PLANS[key] = p
        while len(_PLANS) > CACHE_SIZE:
            _PLANS.popitem(last=False)
    return p
