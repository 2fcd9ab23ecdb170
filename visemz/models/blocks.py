"""Networks run block by block, so that memory follows a block instead of the image.

A convolutional network's output at a position depends on its input within a fixed halo, so running
it on windows (a block of output positions plus that halo of input) and keeping each window's block
gives the whole result up to float rounding.  The analysis transform (float32) and the float64 passes
of the lossless path (synthesis with features, the residual prior) run this way on large inputs: on
the CPU a 2400 x 1900 X-ray's float64 transposed convolutions would otherwise take gigabytes of
im2col buffers.  Blocks are whole rows of the grid where a row of windows fits the budget, else
squares.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from .conv64 import layout_of

# the working memory one window of a network may take (its largest intermediate buffers), by device type
WORK_BYTES = {"cpu": 128 << 20, "cuda": 4 << 30}

Span = tuple[int, int, int, int]  # core start, core end, window start, window end (along one axis)


def spans(n: int, core: int, before: int, after: int) -> Iterator[Span]:
    """Cores of at most ``core`` units along an axis of ``n``, each with its window: the core widened by
    ``before`` and ``after`` units, clipped to the axis."""
    for a in range(0, n, max(1, core)):
        z = min(n, a + max(1, core))
        yield a, z, max(0, a - before), min(n, z + after)


def plan(h: int, w: int, before: int, after: int, unit_bytes: int, device: torch.device) -> list[tuple[Span, Span]]:
    """The blocks of an h x w grid (row span, column span) for a network taking ``unit_bytes`` of working
    memory per grid position of its window, within WORK_BYTES of ``device``'s type."""
    units = max(1, WORK_BYTES[torch.device(device).type] // max(1, unit_bytes))
    halo = before + after
    if (h + halo) * (w + halo) <= units:
        return [((0, h, 0, h), (0, w, 0, w))]
    rows = units // (w + halo) - halo
    row_core, col_core = (rows, w) if rows >= 1 else (max(1, math.isqrt(units) - halo),) * 2
    return [(r, c) for r in spans(h, row_core, before, after) for c in spans(w, col_core, before, after)]


def run(fn, plan_: list[tuple[Span, Span]], scales: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """``fn(row_window, col_window)`` (a tuple of outputs, output i at ``scales[i]`` of the grid's units per
    unit) on every block's window, each output's block copied into place: the whole outputs.  A window's
    outputs are dropped as soon as their block is copied, so memory holds the whole outputs and one window."""
    h, w = plan_[-1][0][1], plan_[-1][1][1]
    out: tuple[torch.Tensor, ...] = ()
    for (a, z, w0, w1), (c, d, v0, v1) in plan_:
        outs = fn((w0, w1), (v0, v1))
        if len(plan_) == 1:
            return tuple(o[:, :, (a - w0) * s:(z - w0) * s, (c - v0) * s:(d - v0) * s] for o, s in zip(outs, scales))
        if not out:
            out = tuple(torch.empty((*o.shape[:2], h * s, w * s), dtype=o.dtype, device=o.device,
                                    memory_format=layout_of(o)) for o, s in zip(outs, scales))
        for whole, o, s in zip(out, outs, scales):
            whole[:, :, a * s:z * s, c * s:d * s] = o[:, :, (a - w0) * s:(z - w0) * s, (c - v0) * s:(d - v0) * s]
        del outs
    return out
