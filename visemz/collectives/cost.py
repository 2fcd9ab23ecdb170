"""The cost model behind ``all_reduce(algorithm="auto")``: one straight line per algorithm.

Each algorithm's time for a tensor of ``n`` bytes is modelled as

    t = latency + n * (codec + wire * link / ratio)

- ``latency``: seconds per call whatever the size (messages, launches, host syncs);
- ``codec``: seconds of codec work per uncompressed byte (encode, homomorphic adds, decode);
- ``wire``: payload bytes the algorithm moves on its critical path per payload byte
  (``wire_factor``); ``link`` the seconds per byte of one link; ``ratio`` the compression
  ratio (1 for plain, which moves the tensor itself).

``CostModel.from_timings`` builds the lines from real timings of every algorithm at two
sizes (what ``autotune.py`` measures on a group): the fitted per-byte cost of plain gives
``link``, and the compressed algorithms' per-byte cost is split into the wire part (at the
ratio the timings were taken at) and the rest, which is codec work.  A later call with
another ratio (``estimates(n, ratio)``) rescales the wire part only.
``CostModel.analytic`` builds the same lines from first principles (a link latency and
bandwidth, codec throughputs), for ``tools/cost_model.py``'s extrapolation to many GPUs.
Pure arithmetic: no torch, no communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError

#: The candidates, in the order ties are broken (plain first: no codec, exact sums).
ALGORITHMS = ("plain", "ring", "recursive_doubling")


def _power_of_two_below(world: int) -> int:
    return 1 << (world.bit_length() - 1)


def wire_factor(algorithm: str, world: int) -> float:
    """Payload bytes on the critical path per payload byte.

    plain and ring: 2 (W - 1) / W (a reduce-scatter and an all-gather of W chunks); recursive
    doubling: log2 p whole payloads for p the largest power of two <= W, plus 2 when W is not
    a power of two (the extra ranks' fold-in and the hand-back of the result)."""
    if algorithm in ("plain", "ring"):
        return 2 * (world - 1) / world
    if algorithm == "recursive_doubling":
        p = _power_of_two_below(world)
        return math.log2(p) + (2 if world > p else 0)
    raise InvalidArgumentError(f"algorithm={algorithm!r}: expected one of {list(ALGORITHMS)}")


def messages(algorithm: str, world: int) -> int:
    """Sequential messages on the critical path.  A compressed exchange sends its size word first; the
    ring's all-gather phase instead gets its W sizes from one all_gather beforehand, whose W - 1 ring
    steps are as many messages."""
    if algorithm == "plain":
        return 2 * (world - 1)
    if algorithm == "ring":
        return 2 * (world - 1) + (world - 1) + (world - 1)
    return 2 * exchanges(algorithm, world)


def exchanges(algorithm: str, world: int) -> int:
    """Compressed payload exchanges on the critical path, each with its host work (posting, waits)."""
    if algorithm == "ring":
        return 2 * (world - 1)
    if algorithm == "recursive_doubling":
        p = _power_of_two_below(world)
        return int(math.log2(p)) + (2 if world > p else 0)
    raise InvalidArgumentError(f"algorithm={algorithm!r}: compressed exchanges of {list(ALGORITHMS[1:])} only")


def fit_corrections(samples: list[tuple[float, float, float, float]]) -> tuple[float, float]:
    """Least-squares ``(step_overhead, codec_scale)`` from measured compressed all_reduces.

    Each sample is ``(measured seconds - the uncorrected model's latency and wire time,
    exchanges on the critical path, the uncorrected model's codec seconds, weight)``: the model
    then reads ``exchanges * step_overhead + codec_scale * codec seconds``.  Both are kept >= 0.
    Weights let each sample count by its relative error (1 / measured seconds)."""
    if len(samples) < 2:
        raise InvalidArgumentError(f"{len(samples)} samples: need at least 2 to fit two corrections")
    sxx = sxy = syy = sxr = syr = 0.0
    for residual, steps, codec, w in samples:
        w2 = w * w
        sxx, sxy, syy = sxx + w2 * steps * steps, sxy + w2 * steps * codec, syy + w2 * codec * codec
        sxr, syr = sxr + w2 * steps * residual, syr + w2 * codec * residual
    det = sxx * syy - sxy * sxy
    if det <= 0:
        raise InvalidArgumentError("samples do not separate per-exchange cost from codec cost")
    overhead, scale = (syy * sxr - sxy * syr) / det, (sxx * syr - sxy * sxr) / det
    if overhead < 0:  # refit with the other term alone
        overhead, scale = 0.0, syr / syy
    if scale < 0:
        overhead, scale = sxr / sxx, 0.0
    return max(overhead, 0.0), max(scale, 0.0)


def adds_per_byte(algorithm: str, world: int) -> float:
    """Homomorphic additions per uncompressed byte of the tensor (ops.py's algorithms)."""
    if algorithm == "ring":
        return (world - 1) / world  # W - 1 chunks of n / W each
    p = _power_of_two_below(world)
    return math.log2(p) + (1 if world > p else 0)  # one whole payload per step, plus the fold-in


@dataclass(frozen=True)
class Line:
    """t = intercept + slope * n, from two timings."""

    intercept: float
    slope: float

    @classmethod
    def through(cls, n1: float, t1: float, n2: float, t2: float) -> Line:
        """The line through two points, its slope and intercept kept >= 0 (timing noise can
        make either negative; a negative cost would make an algorithm look free)."""
        if not n2 > n1 > 0:
            raise InvalidArgumentError(f"calibration sizes {n1}, {n2}: expected 0 < first < second")
        slope = max((t2 - t1) / (n2 - n1), 0.0)
        return cls(max(t1 - slope * n1, 0.0), slope)


@dataclass(frozen=True)
class AlgorithmCost:
    latency: float  # seconds per call
    codec: float  # seconds of codec work per uncompressed byte
    wire: float  # payload bytes on the critical path per payload byte (wire_factor)


@dataclass(frozen=True)
class CostModel:
    """Lines for the candidates of one group (``world`` ranks) and one codec setting.

    ``link``: seconds per byte of one link; ``ratio``: the compression ratio the lines were
    measured at, used when a call gives none."""

    world: int
    link: float
    costs: dict = field(default_factory=dict)  # algorithm -> AlgorithmCost
    ratio: float = 1.0

    def seconds(self, algorithm: str, nbytes: float, ratio: float | None = None) -> float:
        c = self.costs[algorithm]
        r = 1.0 if algorithm == "plain" else max(ratio or self.ratio, 1e-6)
        return c.latency + nbytes * (c.codec + c.wire * self.link / r)

    def estimates(self, nbytes: float, ratio: float | None = None) -> dict[str, float]:
        return {a: self.seconds(a, nbytes, ratio) for a in ALGORITHMS if a in self.costs}

    def choose(self, nbytes: float, ratio: float | None = None) -> str:
        """The fastest candidate; ties go to the earlier one in ALGORITHMS.  Deterministic, so
        ranks holding the same model and ratio choose alike."""
        est = self.estimates(nbytes, ratio)
        return min(est, key=lambda a: (est[a], ALGORITHMS.index(a)))

    @classmethod
    def from_timings(cls, world: int, sizes: tuple[float, float], seconds: dict, ratio: float) -> CostModel:
        """Lines fitted to ``seconds[algorithm] = (t at sizes[0], t at sizes[1])``, measured at
        compression ``ratio``; every algorithm of ALGORITHMS must be there."""
        missing = [a for a in ALGORITHMS if a not in seconds]
        if missing:
            raise InvalidArgumentError(f"timings lack {missing}")
        if not ratio > 0:
            raise InvalidArgumentError(f"ratio={ratio!r}: expected > 0")
        lines = {a: Line.through(sizes[0], seconds[a][0], sizes[1], seconds[a][1]) for a in ALGORITHMS}
        plain_wire = wire_factor("plain", world)
        link = lines["plain"].slope / plain_wire if plain_wire else 0.0
        costs = {}
        for a, line in lines.items():
            wire = wire_factor(a, world)
            on_wire = wire * link / (1.0 if a == "plain" else ratio)
            costs[a] = AlgorithmCost(line.intercept, max(line.slope - on_wire, 0.0), wire)
        return cls(world, link, costs, ratio)

    @classmethod
    def analytic(cls, world: int, alpha: float, link: float, ratio: float, encode_Bps: float,
                 decode_Bps: float, add_Bps: float, step_overhead: float = 0.0, codec_scale: float = 1.0) -> CostModel:
        """Lines from first principles: ``alpha`` seconds per message, ``link`` seconds per byte,
        codec throughputs in uncompressed bytes per second (one encode and one decode of the
        tensor, plus ``adds_per_byte`` homomorphic additions).

        Measured corrections for the compressed algorithms (``fit_corrections``): ``step_overhead``
        seconds per exchange on the critical path (kernel launches, host reads of size and
        result words, allocation) and ``codec_scale``, how much slower the codec work runs inside a
        collective than in the kernels' own benchmark."""
        costs = {"plain": AlgorithmCost(messages("plain", world) * alpha, 0.0, wire_factor("plain", world))}
        for a in ALGORITHMS[1:]:
            codec = codec_scale * (1 / encode_Bps + 1 / decode_Bps + adds_per_byte(a, world) / add_Bps)
            latency = messages(a, world) * alpha + exchanges(a, world) * step_overhead
            costs[a] = AlgorithmCost(latency, codec, wire_factor(a, world))
        return cls(world, link, costs, ratio)

    def as_dict(self) -> dict:
        """For reports: the lines' parameters."""
        return {"world": self.world, "link_s_per_byte": self.link, "ratio": self.ratio,
                "algorithms": {a: {"latency_s": c.latency, "codec_s_per_byte": c.codec, "wire_factor": c.wire}
                               for a, c in self.costs.items()}}
