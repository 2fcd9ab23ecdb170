"""A sparse lossless tile coded as its pixels' differences from their neighbours, under one table (image format 10).

Data stretched from fewer levels and then resampled (16-bit astronomy images scaled from coarse sources, ...) has
values on no lattice, so neither a palette nor the image's levels give the residual prior dense integers; but the
differences of neighbours take few values, each a sum of a few of the coarse steps.  Such a tile's differences
coded order 0 under a table of their own counts take far fewer bits than the prior's (docs/benchmarks.md).  The
encoder tries it where it tries a palette (``residual_coder.encode``) and keeps the smaller.

A tile (its planes' (P, C, H, W) integers) is differenced in one of three ways, ``KINDS``: from the pixel above
(the first row kept), from the pixel to the left (the first column kept), or both (2-D Lorenzo: x - above - left +
above-left); a decoder undoes it with prefix sums, in parallel on any device.  The encoder takes the way whose
differences' order-0 entropy plus an estimate of their table is least.

Sections: ``res_diff_table``, an ints stream of [kind, the smallest difference, the gaps to the next ones, each
difference's frequency out of 2**16]; ``res_diffs``, the conditional rANS stream of every difference's index into
that sorted list, in (P, C, H, W) order, under the one table (the frequencies, then an escape symbol holding the
rest of 2**16, which a writer never uses).  A tile coded otherwise has both sections empty.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..encoders import decode_ints, encode_ints
from ..encoders.cdf_tables import TOTAL, CdfTables, quantize_pmf
from ..encoders.rans import decode_conditional, encode_conditional
from ..errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError
from .pixels import ImageMeta, from_batch, planes

TABLE, DIFFS = "res_diff_table", "res_diffs"
SECTIONS = (TABLE, DIFFS)
ROWS, COLUMNS, BOTH = 1, 2, 3  # from the pixel above, to the left, both
KINDS = (ROWS, COLUMNS, BOTH)
MAX_VALUES = TOTAL - 1  # distinct differences a table holds beside its escape
TABLE_BITS = 16  # the estimated price of a distinct difference in the table section (its gap and its frequency)


def table_limit() -> int:
    """The most values a ``res_diff_table`` section may hold."""
    return 1 + 2 * MAX_VALUES


def differences(x: torch.Tensor, kind: int) -> torch.Tensor:
    """(P, C, H, W) int64 pixels -> their differences of ``kind`` (the same shape and dtype)."""
    d = x.clone()
    if kind in (ROWS, BOTH):
        d[..., 1:, :] -= x[..., :-1, :]
    if kind in (COLUMNS, BOTH):
        d[..., :, 1:] -= d[..., :, :-1].clone()
    return d


def undone(d: torch.Tensor, kind: int) -> torch.Tensor:
    """``differences`` undone: the prefix sums along the axes it differenced."""
    x = d
    if kind in (COLUMNS, BOTH):
        x = torch.cumsum(x, -1)
    if kind in (ROWS, BOTH):
        x = torch.cumsum(x, -2)
    return x


def encode(x: torch.Tensor, meta: ImageMeta) -> dict[str, bytes] | None:
    """A tile's integer pixels (its meta's layout, on any device) -> its two sections, or None where every kind's
    differences take more distinct values than a table holds."""
    px = planes(x.to(torch.int64), meta)
    best = None
    for kind in KINDS:
        d = differences(px, kind)
        lo, bins = _histogram(d)
        c = bins[bins > 0].cpu().numpy()
        if c.size > MAX_VALUES:
            continue
        bits = float((c * np.log2(c.sum() / c)).sum()) + TABLE_BITS * c.size  # the same on every device
        if best is None or bits < best[0]:
            best = (bits, kind, d, lo, bins, c)
    if best is None:
        return None
    _, kind, d, lo, bins, counts = best
    freqs = quantize_pmf(np.append(counts, 0.0))[:-1]  # the escape keeps the rest (at least 1)
    present = bins > 0
    rank = torch.cumsum(present, 0) - 1  # a difference's index into the sorted distinct ones
    index = rank[d.reshape(-1) - lo].to(torch.int32)
    v = (torch.nonzero(present).reshape(-1) + lo).cpu().numpy()
    table = np.concatenate([[kind, v[0]], np.diff(v), freqs]).astype(np.int32)
    stream = encode_conditional(index, torch.zeros_like(index), _tables(freqs))
    return {TABLE: encode_ints(table, policy="block", entropy="zstd"), DIFFS: stream}


def _histogram(d: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(the smallest difference, the count of each value from it to the largest): counted over their span (at most
    4 x 65535 + 1 values), not sorted, which on 4 megapixels takes a GPU several times longer."""
    lo = int(d.min())
    return lo, torch.bincount(d.reshape(-1) - lo)


def decode(sections: dict, meta: ImageMeta, device) -> torch.Tensor:
    """A tile's two sections (``meta``: the tile's) -> its pixels in its meta's layout and dtype; damage raises
    CorruptStreamError."""
    kind, values, freqs = _unpack_table(sections[TABLE])
    shape = planes(torch.empty(meta.shape, device="meta"), meta).shape
    n = math.prod(shape)
    index = torch.zeros(n, dtype=torch.int32, device=device)
    try:
        symbols = torch.as_tensor(decode_conditional(sections[DIFFS], index, _tables(freqs)), device=device)
    except UnsupportedFormatError as err:  # the stream names other tables than the file's own: damage
        raise CorruptStreamError(f"residual differences stream: {err}") from None
    symbols = symbols.to(torch.int64)  # a NumPy or cupy array, shared
    if symbols.numel() != n or bool(((symbols < 0) | (symbols >= values.numel())).any()):
        raise CorruptStreamError("residual differences stream holds an index beyond its table")
    x = undone(values.to(device)[symbols].reshape(shape), kind)
    if bool(((x < int(meta.lo)) | (x > int(meta.hi))).any()):
        raise CorruptStreamError("residual differences decode to a value outside the image's range")
    x = from_batch(x, meta).to(torch.int32)
    return x.to(torch.uint8) if meta.dtype == "uint8" else x.to(torch.uint16)


def _tables(freqs: np.ndarray) -> CdfTables:
    """The one table: the differences' frequencies, then the escape with the rest of 2**16."""
    f = np.append(freqs.astype(np.int64), TOTAL - int(freqs.sum()))
    try:
        return CdfTables(np.concatenate([[0], np.cumsum(f)]), np.array([0, f.size + 1]), np.zeros(1, np.int64))
    except InvalidArgumentError:
        raise CorruptStreamError("residual differences table is not a distribution over 2**16") from None


def _unpack_table(buf) -> tuple[int, torch.Tensor, np.ndarray]:
    """The table section -> (kind, the sorted distinct differences (int64), their frequencies), each checked."""
    v = decode_ints(bytes(buf), max_count=table_limit()).astype(np.int64)
    n = (v.size - 1) // 2  # kind, the first value and n - 1 gaps, n frequencies
    if v.size < 3 or v.size % 2 == 0 or v[0] not in KINDS or bool((v[2:1 + n] <= 0).any()) \
            or bool((v[1 + n:] <= 0).any()) or int(v[1 + n:].sum()) >= TOTAL:
        raise CorruptStreamError("residual differences table is not a kind, increasing values and their frequencies")
    return int(v[0]), torch.from_numpy(np.cumsum(v[1:1 + n])), v[1 + n:]

