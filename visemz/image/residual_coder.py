"""Lossless and near-lossless coding of integer images under the residual prior (residual mode "learned").

For every pixel the prior (``models/residual_prior.py``) predicts a logistic distribution from the
lossy reconstruction, g_s's features and the pixels of earlier passes.  With bound E (levels of the
image's dtype; 0: lossless) and bin b = 2E + 1, a pixel x with predicted mean mu and scale s is coded as

    m0 = floor(mu + 0.5),  q = floor((x - m0 + E) / b),  decoded = clamp(m0 + q b, lo, hi),

so |x - decoded| <= E for every pixel.  q is coded by the conditional rANS coder under the table of
the logistic of scale s / b centred at (mu - m0) / b, on the grid of ``models/residual_tables.py``
(a scale index and a centre index; a scale wider than the grid is coded as q >> k under a narrower
table and its k low bits under a uniform table).

The same on every device: the network runs in float64, whose results differ between a CPU and a
GPU in their last bits only (``encoders/scale_indexes.py`` says by how much).  The integers a pixel
is coded with (m0, the scale index, the centre index) each come from a float64 value by a floor;
the encoder lists every pixel where one of those values lies within TOL of an integer, with the
integers it used, and the decoder takes them from the list.  A pixel not listed was more than TOL
from every boundary, so the decoder's value (off by less than 1e-8) floors alike.

The integer prior (image format 9, ``models/integer_prior.py``) computes the same kind of distribution with a
network in integers, exact on every device; only its two inputs come from float64 values, each by one rounding
(g_s's reduced features, and the prediction in sixteenths of a level), and the encoder lists those within TOL
of a rounding boundary (``res_inputs``) as it lists the pixels above.  Its outputs then go through the same
floors and fixes (their float64 arithmetic, exp and log2, may still differ in a last bit).

Sparse values (lossless only): where a tile uses at most half the levels of its values' span (16-bit
data stretched from fewer levels, 8-bit data scaled by 256, ...), its sorted values may be listed (the
palette) and the pixels coded as indexes into it, the prediction mapped to that index scale by
interpolating between the palette's values; the prior then sees data as dense as the source's levels.
The encoder codes such a tile both ways and keeps the smaller (``encode``); from image format 10 also as its
neighbours' differences under a table of their own (``differences.py``: resampled stretched data), its residual
sections then empty but that coding's two.

Scale calibration (image format 8): the prior's scales are right on average over its training images, not on
every image.  Per coding step the encoder may move the scale indexes of each group of GROUP consecutive ones
(half an octave) by up to MAX_DELTA, an integer shift after the floors (and the fixes list) that the decoder
applies alike: it picks the shift that codes a sample of the step's pixels in the fewest bits under the
tables' integer code lengths (``_calibration``).  The context pixels do not depend on it, so neither does
the network's work.

Sections of a tile: ``res_palette`` (empty bytes, or an ints stream of the first value and the gaps to
the next ones), ``res_fixes`` (the list; empty bytes when nothing is listed, else an ints stream of
[count per step, position gaps, m0, scale indexes, centre indexes]), from format 8 ``res_scales`` (empty
bytes when no group moves, else a zstd frame of GROUPS signed bytes per step, step after step), from format 9
``res_inputs`` (empty bytes when nothing is listed, else an ints stream of [the two counts, the reduced features'
position gaps and values, the predictions' position gaps and values]) and ``res_p0`` ..
``res_p3``, one conditional rANS stream per pass (the pass's q >> k in position order, then its low bits); from
format 10 ``res_diff_table`` and ``res_diffs`` (``differences.py``), empty in a tile the prior codes.
Positions are flat indexes into a step's (planes, 1, h, w) half-resolution grid; pixels of
the padded tile outside the image are not coded and count as a residual of 0 in later passes' context.
A colour tile's passes are coded a channel at a time (``residual_prior.steps``): one section per pass and
channel, ``res_p0c0`` .. ``res_p3c2``, and the fixes list's counts per step in that order.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import zstandard

from ..encoders import decode_ints, encode_ints
from ..encoders.cdf_tables import COST_UNIT
from ..encoders.rans import decode_conditional, encode_conditional
from ..errors import CorruptStreamError
from ..models import architectures, blocks, conv8
from ..models import integer_prior as IP
from ..models import residual_tables as RT
from ..models.residual_prior import CONTEXT_SCALE, HALO, PASSES, depth_to_space, head_channels, space_to_depth, steps
from ..models.residual_weights import Residual
from . import differences as D
from .pixels import ImageMeta, from_batch, planes

FIXES, PALETTE, SCALES, INPUTS = "res_fixes", "res_palette", "res_scales", "res_inputs"
COLOUR = 3  # the channels of the colour prior; any other image is coded plane by plane by the gray one


def step_sections(channels: int) -> tuple[str, ...]:
    """The pass sections of a tile coded by the prior of ``channels`` (1 or 3), one per coding step."""
    if channels == 1:
        return tuple(f"res_p{k}" for k in range(len(PASSES)))
    return tuple(f"res_p{k}c{head_channels(k, sl, channels).start}" for k, sl in steps(channels))


def sections(channels: int, calibrated: bool, integer: bool = False, differences: bool = False) -> tuple[str, ...]:
    """A tile's residual sections; ``calibrated``: with the scale calibration (image format 8 on); ``integer``: coded
    under the integer prior, with its inputs list (image format 9); ``differences``: a sparse lossless tile may be
    coded as differences instead (image format 10)."""
    return (PALETTE, FIXES, *((SCALES,) if calibrated else ()), *((INPUTS,) if integer else ()),
            *step_sections(channels), *(D.SECTIONS if differences else ()))


STEP_SECTIONS = frozenset(step_sections(1) + step_sections(COLOUR))  # every name a pass section may have
MAX_STEPS = len(steps(COLOUR))
SPARSE = 2  # a lossless tile is coded through a palette when the span of its values holds this many levels per value
PALETTE_MAX = 1 << 16  # values a palette may list (every level of uint16)


def sparse(n_values: int, lo: int, hi: int) -> bool:
    """Whether ``n_values`` distinct values within lo..hi are sparse enough for a palette."""
    return SPARSE * n_values <= hi - lo + 1


def fixes_limit(pixels: int) -> int:
    """The most values a tile's fixes section may hold: the steps' counts, then 4 per listed pixel."""
    return MAX_STEPS + 4 * pixels


def inputs_limit(pixels: int) -> int:
    """The most values a tile's inputs section may hold: two counts, then a position and a value per listed input
    (at most conv8.C reduced features per half-resolution position, and one prediction per pixel)."""
    return 2 + 2 * (conv8.C // 4 + 1) * pixels


GROUP = 8  # scale indexes per calibration group: half an octave
GROUPS = RT.SI_MAX // GROUP + 1
MAX_DELTA = 12  # a group's scale indexes move by at most three quarters of an octave (an octave gained no more)
# the shifts the encoder tries, smallest first (of equal costs the first is taken)
DELTAS = tuple(sorted(range(-MAX_DELTA, MAX_DELTA + 1), key=lambda d: (abs(d), d)))
SAMPLES = 1 << 16  # the encoder prices a step's real positions at a stride that leaves at most this many: all of
# a 512 x 512 tile's, every 16th of a 2048 x 2048 one's (every 8th chose as well as all of them on 512 x 512 crops)
KEEP_BITS = 32  # a group's shift is kept where it saves this many bits or more (its share of the section)
STEP_BITS = 512  # and a step's shifts where they save this many together (about the section's own size)
ESCAPE_BITS = 16  # the price of a value beyond its table: its escape symbol and about two bytes of excess
TOL = 1e-6
MAX_Q = 1 << 20  # |q| of any valid stream is below 2**18 (the largest image range over the smallest bin)
TRUNK_HALO = 3  # half-resolution positions the trunk sees around a position (the heads see HALO - 3 more)


def encode(res: Residual, x: torch.Tensor, synthesis: list, meta: ImageMeta, e: int,
           levels_too: bool = True, calibrate: bool = True, differences: bool = False) -> dict[str, bytes]:
    """A tile's pixels ``x`` (its meta's layout, integers) -> its sections.  ``synthesis``: [the tile core's
    float64 reconstruction (planes, C, H, W), the prior's reduction of g_s's features (half resolution)]; the
    features are consumed (the list's entry dropped once the trunk has them, so that they do not sit beside
    the passes).  A lossless tile whose values are sparse is coded through its palette and, with ``levels_too``,
    in its levels as well, and the smaller kept: the palette wins where the values are few in a wide span (data
    stretched from fewer levels), the levels where many values crowd part of the span and a tail spreads the
    rest (the palette's index scale bends the prediction there); measured both ways, not guessed.  With
    ``differences`` (image format 10) such a tile is also coded as its neighbours' differences (``differences.py``,
    the winner where stretched data was resampled), its sections then empty but the two of that coding.
    ``calibrate``: with the scale calibration and its section (image format 8; earlier formats have neither)."""
    x01 = synthesis[0]
    levels = _batch_levels(x, meta, x01)
    palette = _palette_of(levels, _real_mask(meta, x01), meta) if e == 0 else None
    if palette is None:
        return _with_differences(_encoded(res, levels, synthesis, meta, e, None, calibrate), differences)
    by_differences = D.encode(x, meta) if differences else None
    indexes = torch.searchsorted(palette, levels.contiguous()).to(torch.float64)
    # a copy: the list's features stay for the palette's coding
    as_levels = [_encoded(res, levels, list(synthesis), meta, e, None, calibrate)] if levels_too else []
    codings = [_with_differences(c, differences)
               for c in (_encoded(res, indexes, synthesis, meta, e, palette, calibrate), *as_levels)]
    if by_differences is not None:
        codings.append({**{name: b"" for name in codings[0]}, **by_differences})
    return min(codings, key=lambda sections: sum(map(len, sections.values())))


def _with_differences(sections: dict[str, bytes], differences: bool) -> dict[str, bytes]:
    """A prior-coded tile's sections, with the differences' two empty where the format has them."""
    return {**sections, **dict.fromkeys(D.SECTIONS, b"")} if differences else sections


def _encoded(res: Residual, levels: torch.Tensor, synthesis: list, meta: ImageMeta, e: int,
             palette: torch.Tensor | None, calibrate: bool) -> dict[str, bytes]:
    """The sections of a tile's ``levels`` in the domain of ``palette`` (its indexes) or of the image's levels."""
    x01 = synthesis[0]
    fixes, streams, shifts, listed_inputs = [], [], [], []
    later = _HostWork(x01.device)
    quotients: dict[int, torch.Tensor] = {}  # a step's q, made once for its calibration and its stream

    def q_of(i, m0):
        xs = space_to_depth(levels)[:, steps(x01.shape[1])[i][1]].to(torch.int64)
        return torch.div(xs - m0 + e, 2 * e + 1, rounding_mode="floor")

    def fix(k, m0, si, fi, amb, real):
        def listed():
            pos = torch.nonzero((amb if real is None else amb & real).reshape(-1)).reshape(-1)
            fixes.append((pos, m0.reshape(-1)[pos], si.reshape(-1)[pos], fi.reshape(-1)[pos]))
        later.add(listed)
        return m0, si, fi

    def scale(i, m0, si, fi, real):
        if not calibrate:
            return si
        quotients[i] = q_of(i, m0)
        shifts.append(_calibration(quotients[i], si, fi, real, res.tables))
        return _calibrated(si, shifts[-1])

    def symbols(i, m0, shift, table, real):
        q = quotients.pop(i) if i in quotients else q_of(i, m0)
        high = q >> shift
        low = q - (high << shift)
        later.add(lambda: streams.append(encode_conditional(
            *(_coder_array(t) for t in _stream_inputs(high, low, shift, table, real, _wide(shift, real))),
            res.tables)))
        return q

    def inputs(r, amb_r, p16, amb_p):
        def listed():
            for t, amb in ((r, amb_r), (p16, amb_p)):
                pos = torch.nonzero(amb.reshape(-1)).reshape(-1)
                listed_inputs.append((pos, t.reshape(-1)[pos]))
        later.add(listed)
        return r, p16

    _passes(res, synthesis, _Domain(meta, palette), e, fix, scale, symbols, inputs)
    later.run()
    out = {PALETTE: _pack_palette(palette), FIXES: _pack_fixes(fixes)}
    if calibrate:
        out[SCALES] = _pack_scales(shifts)
    if res.integer is not None:
        out[INPUTS] = _pack_inputs(listed_inputs)
    return {**out, **dict(zip(step_sections(x01.shape[1]), streams))}


class _HostWork:
    """The encoder's work of each coding step that waits on the host (listing its ambiguous pixels, the rANS coder's
    reads of its plan and bytes).  On a GPU it runs once every step's GPU work is queued, on a stream of its own
    that waits for its step's work only: the later steps do not depend on it (the encoder knows every pixel), so
    the GPU runs their networks meanwhile instead of idling while the host waits and plans.  On the CPU at once
    (nothing to overlap, and each step's tensors are freed before the next)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.jobs: list = []

    def add(self, job) -> None:
        """``job`` (no arguments), after the work queued so far on the device's current stream."""
        if self.stream is None:
            job()
            return
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self.jobs.append((event, job))

    def run(self) -> None:
        """The queued jobs in order.  Each job's tensors (made on the current stream, read on this one) are released
        only once this stream has finished with them, so that the allocator cannot hand their memory out meanwhile."""
        if self.stream is None:
            return
        while self.jobs:
            event, job = self.jobs.pop(0)
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(event)
                job()
            self.stream.synchronize()
        # what the jobs made (the fixes' tensors) is read on the current stream next
        torch.cuda.current_stream(self.device).wait_stream(self.stream)


def decode(res: Residual, sections: dict, synthesis: list, meta: ImageMeta, e: int) -> torch.Tensor:
    """A tile's sections -> its pixels in its meta's layout and dtype; damage raises CorruptStreamError.
    ``synthesis`` as for ``encode`` (consumed alike)."""
    x01 = synthesis[0]
    planes, c = x01.shape[0], x01.shape[1]
    if len(sections.get(D.DIFFS, b"")) or len(sections.get(D.TABLE, b"")):
        return _by_differences(sections, meta, e, c, x01.device, synthesis)
    grid = planes * (x01.shape[2] // 2) * (x01.shape[3] // 2)  # a step codes one channel's positions
    names = step_sections(c)
    listed = _unpack_fixes(sections[FIXES], grid, len(names), x01.device)
    palette = _unpack_palette(sections[PALETTE], meta, e, x01.device)
    shifts = _unpack_scales(sections.get(SCALES, b""), len(names), x01.device)  # formats before 8: none
    # the passes' range checks, read once after the last pass: a check a pass would make the host wait for the
    # GPU there; a pass after a damaged one still runs in range (its context pixels are clamped to the domain)
    damage: list[tuple[str, torch.Tensor]] = []

    def fix(i, m0, si, fi, amb, real):
        pos, m0_l, si_l, fi_l = listed[i]
        if pos.numel():
            if real is not None and not bool(real.reshape(-1)[pos].all()):
                raise CorruptStreamError("residual fixes list a position outside the image")
            m0, si, fi = (t.reshape(-1).clone() for t in (m0, si, fi))
            m0[pos], si[pos], fi[pos] = m0_l, si_l, fi_l
        return m0, si, fi

    def scale(i, m0, si, fi, real):
        return si if shifts is None else _calibrated(si, shifts[i])

    def inputs(r, amb_r, p16, amb_p):
        (pos_r, values_r), (pos_p, values_p) = _unpack_inputs(sections.get(INPUTS, b""), r.numel(), p16.numel(),
                                                              r.device)
        r.view(-1)[pos_r] = values_r.clamp(-IP.IN_MAX - 1, IP.IN_MAX + 1).to(r.dtype)  # as r is held
        p16.view(-1)[pos_p] = values_p
        return r, p16

    def symbols(i, m0, shift, table, real):
        wide = _wide(shift, real)
        n_low = int(wide.sum())  # the host waits here and in the coder: fewer waits, less idle GPU between passes
        _, idx = _stream_inputs(None, None, shift, table, real, wide if n_low else None)
        values = _as_torch(decode_conditional(sections[names[i]], _coder_array(idx), res.tables), m0.device)
        n = values.numel() - n_low
        high = values[:n].to(torch.int64)
        if real is None:
            q = high.reshape(m0.shape) << shift
        else:
            q = torch.zeros_like(m0)
            q[real] = high << shift[real]
        if n_low:
            low, low_shift = values[n:].to(torch.int64), shift[wide]
            damage.append(("residual pass stream holds a low-bits value outside its table's range",
                           ((low < 0) | (low >= (torch.ones_like(low_shift) << low_shift))).any()))
            q[wide] += low
        damage.append((f"residual pass stream decodes a value beyond {MAX_Q} bins", (q.abs() > MAX_Q).any()))
        return q

    out = _passes(res, synthesis, _Domain(meta, palette), e, fix, scale, symbols, inputs)
    found = torch.stack([flag for _, flag in damage])
    if bool(found.any()):
        raise CorruptStreamError(damage[int(found.to(torch.uint8).argmax())][0])
    if palette is not None:
        out = palette[out.to(torch.int64)]
    return _image_layout(out, meta)


def _by_differences(sections: dict, meta: ImageMeta, e: int, channels: int, device, synthesis: list) -> torch.Tensor:
    """A tile coded as its neighbours' differences: every other residual section must be empty, the tile lossless."""
    synthesis[1] = None  # the prior does not run: its features go
    others = [n for n in (PALETTE, FIXES, SCALES, INPUTS, *step_sections(channels)) if len(sections.get(n, b""))]
    if e != 0 or others or not (len(sections[D.DIFFS]) and len(sections[D.TABLE])):
        raise CorruptStreamError("residual differences need a lossless tile with both their sections and no other "
                                 f"residual section (max_error {e}, other sections {others})")
    return D.decode(sections, meta, device)


# ------------------------------------------------------------------ the passes, alike for both sides
class _Domain:
    """The integers a tile's pixels are coded as: the image's levels lo..hi, or indexes 0..n-1 into a palette."""

    def __init__(self, meta: ImageMeta, palette: torch.Tensor | None):
        self.meta, self.palette = meta, palette
        self.lo, self.hi = (int(meta.lo), int(meta.hi)) if palette is None else (0, palette.numel() - 1)

    def prediction(self, x01: torch.Tensor) -> torch.Tensor:
        """The reconstruction in this domain's units (a palette's: interpolated between its values)."""
        lo, span = self.meta.lo, max(self.meta.hi - self.meta.lo, 1)
        levels = lo + x01.clamp(0, 1) * span
        if self.palette is None:
            return levels
        v, n = self.palette, self.palette.numel()
        if n == 1:
            return torch.zeros_like(levels)
        i = torch.searchsorted(v, levels.contiguous()).clamp(1, n - 1)
        v0, v1 = v[i - 1], v[i]
        return (i - 1) + ((levels - v0) / (v1 - v0)).clamp(0, 1)


def _passes(res: Residual, synthesis: list, domain: _Domain, e: int, fix, scale, symbols, inputs=None):
    """Run the coding steps (``residual_prior.steps``); ``fix(i, m0, si, fi, ambiguous, real)`` gives the integers
    step i codes with, ``scale(i, m0, si, fi, real)`` its calibrated scale indexes and ``symbols(i, m0, shift,
    table, real)`` its q (the encoder codes them, the decoder decodes them); ``real``: the step's positions in the
    image, None where all are; ``inputs`` (the integer prior's) as ``_IntegerNetwork`` takes it.  Returns the decoded
    pixels (planes, C, H, W) as float64 values of the domain."""
    x01 = synthesis[0]
    lo, hi = domain.lo, domain.hi
    u, b = max(hi - lo, 1) / 255.0, 2 * e + 1
    c = x01.shape[1]
    pred = space_to_depth(domain.prediction(x01))
    if res.integer is not None:
        network = _IntegerNetwork(res.integer, synthesis, pred, domain, b, inputs)
    else:
        network = _FloatNetwork(res.prior64, synthesis, pred, u, b)
    # the core's pixels in the image, None where they all are (the common case: no masks, fewer waits for the GPU)
    whole = domain.meta.height >= x01.shape[2] and domain.meta.width >= x01.shape[3]
    real = None if whole else space_to_depth(_real_mask(domain.meta, x01).expand(-1, c, -1, -1)).expand_as(pred)
    known = network.no_context()
    out = torch.zeros_like(pred)
    for i, (k, sl) in enumerate(steps(c)):
        offset, log_scale = network.head(k, head_channels(k, sl, c), known)
        mu = pred[:, sl] + u * offset
        s = u * torch.exp(log_scale)
        m0, si, fi, amb = _integers(mu, s, b)
        real_step = None if real is None else real[:, sl]
        m0, si, fi = (t.reshape(mu.shape) for t in fix(i, m0, si, fi, amb, real_step))
        si = scale(i, m0, si, fi, real_step)
        shift = ((si - RT.TOP + RT.STEPS - 1) // RT.STEPS).clamp_min(0)
        table = (si - RT.STEPS * shift) * RT.CENTRES + fi
        q = symbols(i, m0, shift, table, real_step)
        decoded = (m0 + q * b).clamp(lo, hi).to(torch.float64)
        context = network.context(decoded, sl)
        known[:, sl] = context if real is None else torch.where(real_step, context, 0)
        out[:, sl] = decoded
    return depth_to_space(out, c)


class _FloatNetwork:
    """The float prior's side of the passes (formats 6 to 8): its trunk once, in float64, block by block."""

    def __init__(self, prior, synthesis: list, pred: torch.Tensor, u: float, b: int):
        x01, reduced = synthesis
        synthesis[1] = None  # the trunk below is all the passes need of the features
        planes = x01.shape[0]
        side = [torch.full((planes,), v, dtype=torch.float64, device=x01.device) for v in (math.log2(u), math.log2(b))]
        self.prior, self.pred, self.u = prior, pred, u
        self.width_in = prior.width + 4 * x01.shape[1]
        self.trunk = _blocked(lambda r, q: prior.condition(reduced[:, :, r, q], x01[:, :, _twice(r), _twice(q)],
                                                           *side), reduced, TRUNK_HALO, self.width_in)

    def no_context(self) -> torch.Tensor:
        return torch.zeros_like(self.pred)

    def head(self, k: int, own: slice, known: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _blocked(lambda r, q: torch.cat([t[:, own] for t in self.prior.head(
            k, self.trunk[:, :, r, q], known[:, :, r, q])], 1), self.trunk, HALO - TRUNK_HALO,
            self.width_in).chunk(2, 1)

    def context(self, decoded: torch.Tensor, sl: slice) -> torch.Tensor:
        return (decoded - self.pred[:, sl]) / (CONTEXT_SCALE * self.u)


class _IntegerNetwork:
    """The integer prior's side of the passes (format 9): its two float64 inputs rounded to integers, the reduced
    features ``floor(r + 1/2)`` and the prediction in sixteenths ``floor(16 pred + 1/2)``, where ``inputs(r, r
    ambiguous, p16, p16 ambiguous)`` gives the integers used (the encoder lists the values within TOL of a rounding
    boundary, the decoder takes them from the list); then integers only (``models/integer_prior.py``): on a GPU
    conv8's kernel over the whole tile, else ``integer_prior.run_layer`` block by block."""

    def __init__(self, net: IP.IntegerNet, synthesis: list, pred: torch.Tensor, domain: _Domain, b: int, inputs):
        t_r = synthesis[1] + 0.5
        synthesis[1] = None  # the float64 features go as soon as they are rounded (a 4096 tile's: 1 GiB)
        # a value rounded otherwise elsewhere changes the clamped integer only where -IN_MAX < t_r < IN_MAX + 1, so
        # only those are ambiguous, and r is held clamped one beyond the range, in 16 bits
        amb_r = _near_integer(t_r) & (t_r > -IP.IN_MAX) & (t_r < IP.IN_MAX + 1)
        r = torch.floor_(t_r).clamp_(-IP.IN_MAX - 1, IP.IN_MAX + 1).to(torch.int16)
        del t_r
        t_p = IP.SUB * pred + 0.5
        r, p16 = inputs(r, amb_r, torch.floor(t_p).to(torch.int64), _near_integer(t_p))
        del t_p
        self.net, self.span, self.p16 = net, max(domain.hi - domain.lo, 1), p16
        r = r.clamp(-IP.IN_MAX, IP.IN_MAX)
        recon = IP.recon_steps(p16, domain.lo, self.span)
        side = IP.side_steps(self.span, b)
        self.width_in = net.width + 4 * net.channels
        self.like = pred.new_empty((pred.shape[0], 1, *pred.shape[2:]))  # what sizes a block: float64 per position
        if IP.on_kernel(net, r):
            self.trunk = net.condition(r, recon, side)
        else:
            self.trunk = _blocked(lambda y, x: net.condition(r[:, :, y, x], recon[:, :, y, x], side), self.like,
                                  TRUNK_HALO, self.width_in)

    def no_context(self) -> torch.Tensor:
        return torch.zeros_like(self.p16)

    def head(self, k: int, own: slice, known: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.trunk, conv8.Trunk):
            return tuple(t[:, own] for t in self.net.head(k, self.trunk, known))
        return _blocked(lambda y, x: torch.cat([t[:, own] for t in self.net.head(
            k, self.trunk[:, :, y, x], known[:, :, y, x])], 1), self.like, HALO - TRUNK_HALO,
            self.width_in).chunk(2, 1)

    def context(self, decoded: torch.Tensor, sl: slice) -> torch.Tensor:
        return IP.context_steps(decoded.to(torch.int64), self.p16[:, sl], self.span)


def _integers(mu: torch.Tensor, s: torch.Tensor, b: int):
    """(m0, scale index, centre index, ambiguous): the floors of the float64 parameters, and where any of the
    values floored lies within TOL of an integer (where another device might floor it otherwise)."""
    t_mean = mu + 0.5
    m0 = torch.floor(t_mean)
    t_scale = RT.STEPS * torch.log2(s / (b * RT.SCALE_MIN)) + 0.5
    si = torch.floor(t_scale).clamp(0, RT.SI_MAX)
    shift = torch.ceil((si - RT.TOP) / RT.STEPS).clamp_min(0)
    t_centre = ((mu - m0) / b + 0.5) / torch.exp2(shift) * RT.CENTRES
    fi = torch.floor(t_centre).clamp(0, RT.CENTRES - 1)
    amb = _near_integer(t_mean) | _near_integer(t_scale) | _near_integer(t_centre)
    return m0.to(torch.int64), si.to(torch.int64), fi.to(torch.int64), amb


def _near_integer(t: torch.Tensor) -> torch.Tensor:
    return (t - torch.round(t)).abs() < TOL


# ------------------------------------------------------------------ scale calibration
def _calibrated(si: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Scale indexes moved by their group's shift (``shifts``: GROUPS integers on si's device), kept in range."""
    return (si + shifts[si // GROUP]).clamp(0, RT.SI_MAX)


def _calibration(q: torch.Tensor, si: torch.Tensor, fi: torch.Tensor, real, tables) -> torch.Tensor:
    """The encoder's shifts of a step (GROUPS int64 on q's device): for each group of scale indexes, the one of
    DELTAS under which a sample of the step's positions (at most SAMPLES) costs the fewest bits by the
    tables' integer code lengths (``CdfTables.cost``, what the rANS planner uses), where it saves at least
    KEEP_BITS on the step and the step's shifts STEP_BITS together; else 0.  On the device (no host wait: the
    positions beyond the image are priced at nothing rather than left out, which would read their count), in
    int32: a sum is at most SAMPLES values below 2**14."""
    stride = -(-q.numel() // SAMPLES)

    def sample(t):
        return t.reshape(-1)[::stride].to(torch.int32)

    q, si, fi = sample(q), sample(si), sample(fi)
    start, offsets, n_symbols, cost, deltas = _priced(tables, q.device)
    s = (si[None] + deltas[:, None]).clamp(0, RT.SI_MAX)
    shift = ((s - RT.TOP + RT.STEPS - 1) // RT.STEPS).clamp_min(0)  # as the passes compute it
    table = (s - RT.STEPS * shift) * RT.CENTRES + fi[None]
    v = (q[None] >> shift) - offsets[table]
    last = n_symbols[table] - 1  # the escape symbol
    inside = (v >= 0) & (v < last)
    bits = cost[start[table] + torch.where(inside, v, last)] \
        + COST_UNIT * (shift + torch.where(inside, 0, ESCAPE_BITS).to(torch.int32))
    if real is not None:
        bits *= sample(real)
    group = (si // GROUP).to(torch.int64).expand_as(bits)
    sums = bits.new_zeros((len(DELTAS), GROUPS)).scatter_add_(1, group, bits).to(torch.int64)
    best = sums.argmin(0)  # the first of equal sums: the smallest shift
    saved = (sums[0] - sums.gather(0, best[None])[0]) * stride
    kept = saved >= KEEP_BITS * COST_UNIT
    kept &= (saved * kept).sum() >= STEP_BITS * COST_UNIT
    return torch.where(kept, deltas[best].to(torch.int64), 0)


@functools.lru_cache(maxsize=8)
def _priced(tables, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The tables' (entry starts, offsets, symbol counts, code lengths) and DELTAS as int32 tensors on ``device``."""
    arrays = (tables.cdf_start, tables.offsets, tables.n_symbols, tables.cost, np.asarray(DELTAS))
    return tuple(torch.from_numpy(np.array(a, np.int32)).to(device) for a in arrays)  # a copy: theirs are read-only


def _pack_scales(shifts: list) -> bytes:
    """The steps' shifts (each GROUPS integers) as the section holds them: ``pack_scales`` of them, step after step."""
    return pack_scales(torch.stack(shifts).reshape(-1).cpu().numpy())


def pack_scales(shifts: np.ndarray) -> bytes:
    """A ``res_scales`` section: empty where no shift moves a group, else one zstd frame (magicless, its content size
    written, no checksum: the container's covers it) of the shifts as signed bytes.  An ints stream's headers would
    take twice the 40-50 bytes this takes."""
    if not shifts.any():
        return b""
    return zstandard.ZstdCompressor(compression_params=_SCALES_FRAME).compress(shifts.astype(np.int8).tobytes())


_SCALES_FRAME = zstandard.ZstdCompressionParameters.from_level(
    19, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_checksum=0, write_content_size=1, write_dict_id=0)


def check_scales(buf) -> int:
    """A ``res_scales`` section's declared count of shifts (0 where empty), from its frame header alone: GROUPS
    per step of a gray or a colour tile, else CorruptStreamError."""
    if len(buf) == 0:
        return 0
    try:
        size = zstandard.get_frame_parameters(bytes(buf), format=zstandard.FORMAT_ZSTD1_MAGICLESS).content_size
    except zstandard.ZstdError as err:
        raise CorruptStreamError(f"residual scale calibration is not a zstd frame: {err}") from None
    if size not in {GROUPS * len(step_sections(c)) for c in (1, COLOUR)}:
        raise CorruptStreamError(f"residual scale calibration declares {size} shifts: expected {GROUPS} per step")
    return size


def unpack_scales(buf) -> np.ndarray:
    """A ``res_scales`` section -> its shifts (int64, step after step; none where empty), each checked."""
    size = check_scales(buf)
    if size == 0:
        return np.zeros(0, np.int64)
    try:
        raw = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS).decompress(
            bytes(buf), max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as err:
        raise CorruptStreamError(f"residual scale calibration is not a zstd frame: {err}") from None
    v = np.frombuffer(raw, np.int8).astype(np.int64)
    largest = int(np.abs(v).max()) if v.size else 0  # an empty array has no maximum
    if v.size != size or largest > MAX_DELTA:
        raise CorruptStreamError(f"residual scale calibration holds {v.size} shifts of up to {largest}: "
                                 f"expected {size} within -{MAX_DELTA}..{MAX_DELTA}")
    return v


def _unpack_scales(buf, n_steps: int, device) -> torch.Tensor | None:
    """The ``res_scales`` section -> (steps, GROUPS) shifts on ``device``, or None where empty (no shift)."""
    v = unpack_scales(buf)
    if v.size == 0:
        return None
    if v.size != n_steps * GROUPS:
        raise CorruptStreamError(f"residual scale calibration holds {v.size} shifts for a tile of {n_steps} steps: "
                                 f"expected {n_steps * GROUPS}")
    return torch.from_numpy(v).reshape(n_steps, GROUPS).to(device)


def _stream_inputs(high, low, shift, table, real, wide):
    """A pass's symbols (None when ``high`` is None) and table indexes as the coder takes them: every real
    position's q >> k under its table, then the low bits of those with k > 0 under the uniform tables.  ``real``:
    the positions in the image (None: all); ``wide``: those with k > 0 (``_wide``; None where none is)."""
    def at_real(t):
        return t.reshape(-1) if real is None else t[real]

    if wide is None:
        return None if high is None else at_real(high).to(torch.int32), at_real(table).to(torch.int32)
    idx = torch.cat([at_real(table), RT.UNIFORM + shift[wide] - 1]).to(torch.int32)
    if high is None:
        return None, idx
    return torch.cat([at_real(high), low[wide]]).to(torch.int32), idx


def _wide(shift: torch.Tensor, real) -> torch.Tensor:
    """The real positions (``real``: None, all) whose q is coded as q >> k and k low bits (k = ``shift`` > 0)."""
    return shift > 0 if real is None else real & (shift > 0)


def _twice(s: slice) -> slice:
    return slice(2 * s.start, 2 * s.stop)


# ------------------------------------------------------------------ blocks (memory follows a block)
def _blocked(fn, like: torch.Tensor, halo: int, channels_in: int) -> torch.Tensor:
    """``fn(rows, cols)`` (the network on those windows of the half-resolution grid of ``like``) block by block
    (``models/blocks.py``), each window ``halo`` positions wider than its block: the whole grid's result up
    to float rounding.  Working memory per position: a 3 x 3 convolution's im2col over ``channels_in`` and its
    output; on conv64's kernels (no im2col), a layer's input and output and one more buffer of as many channels."""
    im2col = not architectures.implicit_gemm_on(like)
    unit = (9 * channels_in * 2 if im2col else 3 * channels_in) * like.element_size() * like.shape[0]
    plan = blocks.plan(like.shape[2], like.shape[3], halo, halo, unit, like.device)
    return blocks.run(lambda r, c: (fn(slice(*r), slice(*c)),), plan, (1,))[0]


# ------------------------------------------------------------------ layouts
def _batch_levels(x: torch.Tensor, meta: ImageMeta, like: torch.Tensor) -> torch.Tensor:
    """A tile's pixels (meta layout) -> float64 levels shaped and placed like ``like`` (planes, C, H, W: the
    core's padded shape; zeros beyond the image, whose pixels are not coded)."""
    t = planes((x.to(torch.int32) if meta.dtype == "uint16" else x).to(torch.float64), meta)
    out = torch.zeros_like(like)
    out[:, :, :t.shape[2], :t.shape[3]] = t.to(out.device)
    return out


def _real_mask(meta: ImageMeta, x01: torch.Tensor) -> torch.Tensor:
    """(1, 1, H, W) bool: the core's pixels that lie in the image."""
    m = torch.zeros((1, 1, *x01.shape[2:]), dtype=torch.bool, device=x01.device)
    m[:, :, :meta.height, :meta.width] = True
    return m


def _image_layout(out: torch.Tensor, meta: ImageMeta) -> torch.Tensor:
    x = from_batch(out, meta).to(torch.int32)
    return x.to(torch.uint8) if meta.dtype == "uint8" else x.to(torch.uint16)


# ------------------------------------------------------------------ the palette
def _palette_of(levels: torch.Tensor, real: torch.Tensor, meta: ImageMeta) -> torch.Tensor | None:
    """A lossless tile's sorted values (float64) where they are sparse within their own span, else None
    (values that fill their span, however narrow, are coded as they are)."""
    values = torch.unique(levels[real.expand_as(levels)])
    return values if sparse(values.numel(), int(values[0]), int(values[-1])) else None


def _pack_palette(palette: torch.Tensor | None) -> bytes:
    if palette is None:
        return b""
    v = palette.to(torch.int64).cpu()
    return encode_ints(torch.diff(v, prepend=v.new_zeros(1)).to(torch.int32).numpy(), policy="block", entropy="zstd")


def _unpack_palette(buf, meta: ImageMeta, e: int, device) -> torch.Tensor | None:
    """The palette section -> the tile's values (float64, strictly increasing within the image's range), or None."""
    if len(buf) == 0:
        return None
    v = torch.cumsum(torch.from_numpy(decode_ints(bytes(buf), max_count=PALETTE_MAX).astype(np.int64)), 0)
    lo, hi = int(meta.lo), int(meta.hi)
    if e != 0 or v.numel() == 0 or not sparse(v.numel(), int(v[0]), int(v[-1])) or int(v[0]) < lo \
            or int(v[-1]) > hi or bool((torch.diff(v) <= 0).any()):
        raise CorruptStreamError("residual palette is not a sparse, increasing list of values within the image's range")
    return v.to(device, torch.float64)


# ------------------------------------------------------------------ coder arrays and the fixes list
def _coder_array(t: torch.Tensor):
    """What the rANS coder takes: a CUDA tensor as it is, a CPU tensor as NumPy."""
    return t.contiguous() if t.is_cuda else t.contiguous().numpy()


def _as_torch(a, device) -> torch.Tensor:
    return torch.as_tensor(a, device=device) if not isinstance(a, np.ndarray) else torch.from_numpy(a).to(device)


def _pack_fixes(fixes: list) -> bytes:
    counts = [int(f[0].numel()) for f in fixes]
    if not any(counts):
        return b""
    parts = [torch.tensor(counts)] + [_gaps(f[0]) for f in fixes] + [torch.cat([f[i] for f in fixes]).cpu()
                                                                     for i in (1, 2, 3)]
    return _ints_section(parts)


def _gaps(pos: torch.Tensor) -> torch.Tensor:
    """Increasing positions as a list section holds them: the first, then the gaps (on the host)."""
    return torch.diff(pos, prepend=pos.new_zeros(1)).cpu()


def _positions(gaps: torch.Tensor, size: int, what: str) -> torch.Tensor:
    """A list section's gaps -> its positions, checked to increase within a tensor of ``size`` values."""
    pos = torch.cumsum(gaps, 0)
    if gaps.numel() and (bool((gaps[1:] <= 0).any()) or int(pos[0]) < 0 or int(pos[-1]) >= size):
        raise CorruptStreamError(f"residual {what} positions are not increasing within their tensor")
    return pos


def _ints_section(parts: list) -> bytes:
    """Integers (host tensors, each below 2**31 in magnitude) as one ints stream, uncompressed past its packing."""
    return encode_ints(torch.cat(parts).to(torch.int32).numpy(), policy="global", entropy="none")


def _pack_inputs(listed: list) -> bytes:
    """The integer prior's listed inputs (positions and values of the reduced features, then of the prediction)
    as the ``res_inputs`` section: empty where none is listed, else an ints stream of [the two counts, each list's
    position gaps and values]."""
    counts = [int(pos.numel()) for pos, _ in listed]
    if not any(counts):
        return b""
    parts = [torch.tensor(counts)]
    for pos, values in listed:
        parts += [_gaps(pos), values.cpu()]
    return _ints_section(parts)


def _unpack_inputs(buf, n_reduced: int, n_pred: int, device) -> tuple[tuple, tuple]:
    """The ``res_inputs`` section -> ((positions, values) of the reduced features, the same of the prediction),
    each list's positions increasing within its tensor (``n_reduced``, ``n_pred`` values), else CorruptStreamError."""
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    if len(buf) == 0:
        return (empty, empty), (empty, empty)
    v = torch.from_numpy(decode_ints(bytes(buf), max_count=2 + 2 * (n_reduced + n_pred)).astype(np.int64))
    counts = v[:2].tolist() if v.numel() >= 2 else [-1, -1]
    if min(counts) < 0 or v.numel() != 2 + 2 * sum(counts):
        raise CorruptStreamError("residual inputs section does not hold its counts' worth of values")
    out, start = [], 2
    for n, size in zip(counts, (n_reduced, n_pred)):
        pos = _positions(v[start:start + n], size, "inputs")
        out.append((pos.to(device), v[start + n:start + 2 * n].to(device)))
        start += 2 * n
    return out[0], out[1]


def _unpack_fixes(buf, grid: int, n_steps: int, device) -> list[tuple]:
    """The fixes section -> per step (positions, m0, scale indexes, centre indexes), each checked.  ``grid``:
    the positions of a step's (planes, channels, h, w) half-resolution grid."""
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    if len(buf) == 0:
        return [(empty, empty, empty, empty)] * n_steps
    v = torch.from_numpy(decode_ints(bytes(buf), max_count=fixes_limit(n_steps * grid)).astype(np.int64))
    counts = v[:n_steps]
    total = int(counts.sum()) if v.numel() >= n_steps else -1
    if v.numel() < n_steps or bool((counts < 0).any()) or v.numel() != n_steps + 4 * total:
        raise CorruptStreamError("residual fixes section does not hold its counts' worth of values")
    gaps, m0, si, fi = v[n_steps:].split(total)
    if bool(((si < 0) | (si > RT.SI_MAX) | (fi < 0) | (fi >= RT.CENTRES)).any()):
        raise CorruptStreamError("residual fixes section holds a scale or centre index outside the table grid")
    out, start = [], 0
    for n in counts.tolist():
        pos = _positions(gaps[start:start + n], grid, "fixes")
        out.append((pos.to(device), *(t[start:start + n].to(device) for t in (m0, si, fi))))
        start += n
    return out
