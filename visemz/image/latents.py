"""A model's integer latent symbols <-> an image file's sections, for each image format that codes them.

Channel-context models (format 7, ``models/channel_context.py``): y is coded slice by slice, each
slice a section of its own (``y0``, ``y1``, ...) coded as the mean-scale model's y is, with the
Gaussian tables its scales pick; the scales come from the float64 slice transforms, which see
the hyperprior's parameters and the slices decoded before, so the decoder decodes slice k before
it computes the scales of slice k + 1.  One scale exception section (``y_scales``) covers all
slices, its positions counted over the slices one after the other (each slice's symbols in C
order).

Format 3 (written today): conditional rANS with the tables shipped in the weights
(``model.visemz_tables``), or per section the format-2 coding where that is smaller (the
header's ``coding`` says which).  The factorized model's y and the hyperprior model's z use one
table per channel (the EntropyBottleneck's); the hyperprior model's y uses the Gaussian
table that the scale predicted from z picks.  Those scales come from a float64
hyper-synthesis (``net64``) on whichever device runs, and ``scale_indexes`` lists in the
section ``y_scales`` the few positions whose table could differ between devices, so a
file decodes alike everywhere.

Format 2 (still read, and written on request for comparisons and tests): each symbol
tensor as an ints stream (block encoder, per-block widths, then the codec's entropy stage).

On CUDA every step stays on the GPU (torch / cupy arrays); on the CPU the NumPy reference
coder runs; both write the same bytes.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .. import cuda, defaults
from .. import device as dev
from ..encoders import EncoderConfig, start_encode_ints
from ..encoders.rans import decode_conditional, encode_conditional
from ..encoders.scale_indexes import (
    apply_scale_exceptions,
    decode_and_apply_scale_exceptions,
    encode_scale_exceptions,
    read_scale_exceptions,
    scale_indexes,
)
from ..errors import CorruptStreamError, UnsupportedFormatError
from ..models import architectures, channel_context, graphs
from .pixels import PAD

BLOCK, RANS = 2, 3  # the image formats, by how they code the symbols
# Latent symbols use per-block widths in format 2: on the trained models' latents they came out
# 1-11% smaller than the global width with outliers (after zstd), and the GPU's per-block kernel is
# the faster one.  Either policy decodes: the block stream records it.
SYMBOL_POLICY = "block"
CODINGS = ("rans", "ints")  # format 3: how each symbol section is coded (the header's "coding")
SCALES = "y_scales"  # format 3, hyperprior models: the scale-index exceptions


def symbol_sections(net) -> list[str]:
    """A model's symbol sections, in the order a tiled file lists them: ``y`` (factorized), ``y``, ``z``
    (mean-scale), ``y0`` .. ``y{S-1}``, ``z`` (channel context, S slices)."""
    if channel_context.is_context(net):
        return [slice_name(k) for k in range(len(net.slices))] + ["z"]
    return ["y", "z"] if architectures.has_hyperprior(net) else ["y"]


def slice_name(k: int) -> str:
    return f"y{k}"


def section_shapes(net, shapes: dict[str, tuple]) -> dict[str, tuple]:
    """The shapes of a model's symbol sections, from ``architectures.latent_shapes``: those shapes, and for a
    channel-context model each slice's (``y0`` .. ``y{S-1}``) beside them."""
    if not channel_context.is_context(net):
        return dict(shapes)
    batch, _, h, w = shapes["y"]
    return {**shapes, **{slice_name(k): (batch, g, h, w) for k, g in enumerate(net.slices)}}


def section_names(fmt: int, symbol_names) -> set[str]:
    """The sections an image file of format ``fmt`` must hold for these symbol tensors."""
    names = set(symbol_names)
    return names | {SCALES} if fmt == RANS and "z" in names else names


def rans_sections(meta: dict) -> set[str]:
    """The sections of an image file (its header ``meta``) that are conditional rANS streams."""
    return {k for k, v in (meta.get("coding") or {}).items() if v == "rans"}


def encode(fmt: int, net, net64, symbols: dict[str, torch.Tensor], quality: float,
           enc: dict) -> tuple[dict[str, bytes], dict[str, str] | None]:
    """Symbol tensors (int32, on the codec's device) -> (sections, coding).  ``enc``: the ints streams' options.

    Format 3 codes each symbol tensor with rANS and the model's prior; a section with a static prior
    (``tries_ints``) is also coded the format-2 way, as an ints stream (block encoder + entropy stage), and
    the smaller kept: that wins where the learned prior fits the image badly (a factorized prior on flat
    X-ray backgrounds, a quality far from those it was trained at).  ``coding`` records the choice per
    section ("rans" / "ints"; None: format 2).
    """
    cfg = EncoderConfig(SYMBOL_POLICY, **enc)
    tried = list(symbols) if fmt == BLOCK else [k for k in symbols if tries_ints(k, symbols)]
    # on a GPU the ints streams' entropy launch runs on its own stream while the rANS coder runs on ours
    ints_of = start_encode_ints([(dev.torch_to_ints(symbols[k]), cfg) for k in tried])
    if fmt == BLOCK:
        return dict(zip(tried, ints_of())), None
    sections = _encode_rans(net, net64, symbols, quality)
    ints = dict(zip(tried, ints_of()))
    coding = {}
    for k in symbol_sections(net):
        coding[k] = "ints" if k in ints and len(ints[k]) < len(sections[k]) else "rans"
        sections[k] = ints[k] if coding[k] == "ints" else sections[k]
    return sections, coding


# A hyper-latent's ints stream is tried only when at least this share of its symbols is 0: measured on the
# CPU over Kodak and the X-ray eval set at qualities 1-8 (mbt2018-mean,
# docs/results/codec/symbol_codings.jsonl, its z_zeros field), Kodak's z had 0.80-0.90 zeros and its ints
# stream was 1.05-1.23x its rANS stream, never smaller; the X-rays' z had 0.94-0.97 zeros and its ints stream
# was 0.53-0.94x, always smaller.  The trial costs about 1 ms of host time per image.
Z_INTS_MIN_ZEROS = 0.90


def tries_ints(name: str, symbols) -> bool:
    """Whether format 3 also codes section ``name`` as an ints stream, to keep the smaller coding.

    Not a hyperprior model's y: each of its symbols has its own predicted distribution, and on every
    image of Kodak and of the X-ray eval set at qualities 1-8 (mbt2018-mean, CPU;
    docs/results/codec/symbol_codings.jsonl) its ints stream was 1.13-1.86x its rANS stream, never
    smaller, while the trial cost a Kodak image's compress 1.5-3.4 ms of GPU zstd (profile_codec on an H100
    and an H200).  The static priors do lose to it: balle2016's y and the hyper-latent z on
    flat images (the X-rays), where zstd's runs beat the prior: z is tried when at least ``Z_INTS_MIN_ZEROS``
    of its symbols are 0 (an integer count, so every device decides alike)."""
    if "z" not in symbols:
        return True
    return name == "z" and zero_share(symbols["z"]) >= Z_INTS_MIN_ZEROS


def zero_share(t: torch.Tensor) -> float:
    """The share of a symbol tensor's values that are 0 (one host read on a GPU)."""
    if t.numel() == 0:
        return 0.0
    return 1.0 - int(torch.count_nonzero(t)) / t.numel()


def _encode_rans(net, net64, symbols: dict[str, torch.Tensor], quality: float) -> dict[str, bytes]:
    coded, scales = rans_inputs(net, net64, symbols, quality)
    out = {k: encode_conditional(sym, idx, tables, lane_symbols=lanes)
           for k, (sym, idx, tables, lanes) in coded.items()}
    return out if scales is None else {**out, SCALES: scales}


def rans_inputs(net, net64, symbols: dict[str, torch.Tensor], quality: float) -> tuple[dict[str, tuple], bytes | None]:
    """What format 3's rANS coder codes of each symbol tensor, ``{name: (symbols, table indexes, tables,
    lane_symbols)}`` (the coders' arrays, on the codec's device), and a hyperprior model's scale-exception
    section (None for the factorized model)."""
    tables = _tables(net)
    if "z" not in symbols:
        y = symbols["y"]
        return {"y": (_array(y), _channels(y.shape, y.device), tables.factorized, None)}, None
    z = symbols["z"]
    hyper_lanes = min(defaults.get("rans_lane_symbols"), defaults.get("rans_hyper_lane_symbols"))
    coded = {"z": (_array(z), _channels(z.shape, z.device), tables.factorized, hyper_lanes)}
    if channel_context.is_context(net):
        return _context_inputs(net, net64, symbols, quality, coded)
    idx, ambiguous = scale_indexes(_array(_scales(net64, z, quality)), tables.scale_table)
    coded["y"] = (_array(symbols["y"]), idx, tables.gaussian, None)
    return coded, encode_scale_exceptions(idx, ambiguous)


def _context_inputs(net, net64, symbols: dict[str, torch.Tensor], quality: float,
                    coded: dict[str, tuple]) -> tuple[dict[str, tuple], bytes]:
    """``rans_inputs`` of a channel-context model: each slice's symbols with the table indexes of its float64
    scales, and the one exception section of all slices (positions counted over the slices in order)."""
    tables = _tables(net)
    indexes, listed, start = [], [], 0
    parts = channel_context.split(net, symbols["y"])
    for k, scales in enumerate(_context_scales(net64, symbols, quality)):
        idx, ambiguous = scale_indexes(_array(scales), tables.scale_table)
        coded[slice_name(k)] = (_array(parts[k].contiguous()), idx, tables.gaussian, None)
        indexes.append(idx)
        if ambiguous.size:
            listed.append(ambiguous + start)
        start += idx.size
    if not listed:
        return coded, b""
    xp = cuda.require_cupy() if cuda.is_gpu_array(indexes[0]) else np
    flat = xp.concatenate([i.reshape(-1) for i in indexes])
    return coded, encode_scale_exceptions(flat, xp.concatenate(listed))


def decode(net, net64, sections: dict, shapes: dict[str, tuple], quality: float, device: str,
           coding: dict[str, str] | None) -> dict[str, torch.Tensor]:
    """Sections -> symbol tensors of ``shapes`` (int32, on ``device``); damage raises CorruptStreamError.

    ``coding``: the header's per-section choice (format 3), None for format 2 (all ints streams)."""
    if channel_context.is_context(net):
        return _decode_context(net, net64, sections, shapes, quality, device, coding)
    rans = {k for k, v in (coding or {}).items() if v == "rans"}
    out = {k: _shaped(dev.ints_to_torch(sections[k], device, count=math.prod(shape)), shape, k)
           for k, shape in shapes.items() if k not in rans}
    if not rans:
        return out
    tables = _tables(net)
    if "z" in rans:
        idx = _channels(shapes["z"], device)
        out["z"] = _shaped(_tensor(decode_conditional(sections["z"], idx, tables.factorized), device), shapes["z"], "z")
    if "y" in rans and "z" not in shapes:
        idx = _channels(shapes["y"], device)
        out["y"] = _shaped(_tensor(decode_conditional(sections["y"], idx, tables.factorized), device), shapes["y"], "y")
    elif "y" in rans:
        scales = _array(_scales(net64, out["z"], quality))
        if tuple(scales.shape) != tuple(shapes["y"]):
            raise CorruptStreamError(f"hyper-synthesis gives scales {tuple(scales.shape)} for symbols {shapes['y']}")
        idx = decode_and_apply_scale_exceptions(sections[SCALES], scales, tables.scale_table)
        out["y"] = _shaped(_tensor(decode_conditional(sections["y"], idx, tables.gaussian), device), shapes["y"], "y")
    return {k: out[k] for k in shapes}


def _decode_context(net, net64, sections: dict, shapes: dict[str, tuple], quality: float, device: str,
                    coding: dict[str, str]) -> dict[str, torch.Tensor]:
    """``decode`` for a channel-context model: z, then the slices in order, each slice's table indexes from the
    float64 scales that the slices before it give."""
    tables = _tables(net)
    z = _decode_section(sections, "z", shapes["z"], coding["z"], lambda: _channels(shapes["z"], device),
                        tables.factorized, device)
    batch, _, h, w = shapes["y"]
    named = section_shapes(net, shapes)
    slice_shapes = [named[slice_name(k)] for k in range(len(net.slices))]
    listed = read_scale_exceptions(sections[SCALES], sum(math.prod(s) for s in slice_shapes), tables.scale_table.size)
    params = architectures.hyper_output(net64, z.to(torch.float64), quality)
    if tuple(params.shape) != (batch, 2 * shapes["y"][1], h, w):
        raise CorruptStreamError(f"hyper-synthesis gives parameters {tuple(params.shape)} for symbols {shapes['y']}")
    starts = np.cumsum([0] + [math.prod(s) for s in slice_shapes])
    decoded = []

    def take(k: int, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        mine = (listed[0] >= starts[k]) & (listed[0] < starts[k + 1])

        def indexes():
            return apply_scale_exceptions(_array(sigma.contiguous()), tables.scale_table, listed[0][mine] - starts[k],
                                          listed[1][mine])

        name = slice_name(k)
        decoded.append(_decode_section(sections, name, slice_shapes[k], coding[name], indexes, tables.gaussian, device))
        return decoded[-1].to(mu.dtype) + mu

    channel_context.walk(net64, params, take, architectures.transform)
    return {"y": torch.cat(decoded, 1), "z": z}


def _decode_section(sections: dict, name: str, shape: tuple, coding: str, indexes, tables, device: str) -> torch.Tensor:
    """One symbol section of ``shape``: an ints stream, or conditional rANS with ``indexes()``'s tables."""
    if coding != "rans":
        return _shaped(dev.ints_to_torch(sections[name], device), shape, name)
    return _shaped(_tensor(decode_conditional(sections[name], indexes(), tables), device), shape, name)


def _context_scales(net64, symbols: dict[str, torch.Tensor], quality: float) -> list[torch.Tensor]:
    """A channel-context model's float64 scales of each slice, from its symbols (as the decoder computes them)."""
    z, y = symbols["z"], symbols["y"]
    return graphs.run(lambda zs, ys: architectures.context_scales(net64, {"z": zs, "y": ys}, quality), (z, y),
                      key=("context_scales", float(quality)), owner=net64, pixels=graphs.pixels(z, PAD),
                      keep=lambda: architectures.gains(net64, quality, torch.float64, z.device))


def _tables(net):
    tables = getattr(net, "visemz_tables", None)
    if tables is None:
        raise UnsupportedFormatError("these weights hold no entropy coding tables (image format 3 needs them): "
                                     "re-write them with tools/export_weights.py --add-tables")
    return tables


def _scales(net64, z: torch.Tensor, quality: float) -> torch.Tensor:
    """Scales of the gained latent, from a float64 hyper-synthesis (device-independent up to its last bits)."""
    def scales_of(z_sym: torch.Tensor) -> torch.Tensor:
        return architectures._hyper_params(net64, z_sym.to(torch.float64), quality)[0].contiguous()

    return graphs.run(scales_of, (z,), key=("scales", float(quality)), owner=net64, pixels=graphs.pixels(z, PAD),
                      keep=lambda: architectures.gains(net64, quality, torch.float64, z.device))


def _channels(shape, device) -> torch.Tensor | object:
    """Each symbol's channel (dim 1) as its table index: int32, on ``device`` (NumPy on the CPU).

    Cached per shape and device: every image of a size uses the same index array, and building it
    is two kernel launches and an allocation per section (host work per image).  The
    coders only read it; the NumPy copy is made read-only so that nothing can change it."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:  # "cuda" names the current device: key the cache by its number
        d = torch.device("cuda", torch.cuda.current_device())
    return _channels_cached(tuple(int(n) for n in shape), str(d))


@functools.lru_cache(maxsize=64)
def _channels_cached(shape: tuple, device: str):
    c = torch.arange(shape[1], dtype=torch.int32, device=device).view(1, -1, *([1] * (len(shape) - 2)))
    c = c.expand(*shape).contiguous()
    if c.is_cuda:
        return dev.published(c)  # built on this thread's stream; other streams (pipeline lanes) read the cached tensor
    a = c.numpy()
    a.flags.writeable = False
    return a


def _array(t: torch.Tensor):
    """What the coders take: a CUDA tensor as it is (they run on the GPU), a CPU tensor as NumPy."""
    return t if t.is_cuda else t.numpy()


def _tensor(a, device: str) -> torch.Tensor:
    """A decoder's NumPy or cupy output as a torch tensor on ``device`` (cupy: no copy)."""
    return torch.as_tensor(a, device=device) if cuda.is_gpu_array(a) else torch.from_numpy(a)


def _shaped(s: torch.Tensor, shape, name: str) -> torch.Tensor:
    if s.numel() != math.prod(shape):
        raise CorruptStreamError(f"section {name!r} holds {s.numel()} symbols, expected {math.prod(shape)}")
    return s.reshape(shape)
