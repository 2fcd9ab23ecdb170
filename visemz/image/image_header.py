"""The image file's header schema (docs/FORMAT.md, section 4): every field of an image container's meta
checked for its type, a finite value, its range and its agreement with the other fields, and every
section's declared size against the shapes the header gives, before anything is decoded.

A damaged or crafted header is ``CorruptStreamError`` naming the field; a valid header of something this
build does not read (a newer format, an unknown model) ``UnsupportedFormatError``; an image larger than the
pixel limit (``VISEMZ_MAX_PIXELS``) ``LimitExceededError``.  ``codec.py`` calls ``check`` on every file it
opens, ``check_tiles`` on a tiled one, and ``check_sections`` once it knows the model's latent shapes.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .. import container
from ..config import real_number, whole_number
from ..encoders import ENTROPIES, stream
from ..encoders import layout as L
from ..encoders import rans_layout as RL
from ..errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError
from ..models import registry
from . import differences as differences_coder
from . import latents, residual, residual_coder, tile_index, tiling
from .pixels import DTYPES, MAX_CHANNELS, ImageMeta, check_pixels, coded_meta, max_error_limit

KIND = "image"
# 1: fixed-rate N=64/M=96 models, one per integer quality 1-4 (visemz 0.1), no longer decoded;
# 2: variable-rate N=128/M=192 models with gain units, a float quality in the header, symbols
#    block-coded (ints streams); still read, and written on request (``image_format=2``);
# 3: the same models, symbols coded by conditional rANS with the weights' tables (``latents.py``);
# 4: format 3's coding per tile of a grid (``tiling.py``), with a tile index (``tile_index.py``), so
#    that memory follows the tile and a region decodes only the tiles it needs;
# 5: format 4 with the tile index's part lengths as varints (one-tile files: 7 bytes instead of 26);
# 6: format 5 whose integer images' max_error residual may be coded under the residual prior
#    (residual "learned", ``residual_coder.py``), the prior named by ``residual_id``;
# 7: format 6 for channel-context models only (``models/channel_context.py``): y in slice sections
#    y0, y1, ... (``latents.py``); written for them, never for the others;
# 8: format 6 whose learned residual's scale indexes may be calibrated per image (section res_scales,
#    ``residual_coder.py``);
# 9: format 8 whose learned residual is coded under the integer prior (``models/integer_prior.py``), its
#    inputs' borderline roundings listed (section res_inputs);
# 10: format 8 (the float prior) whose sparse lossless tiles may be coded as their neighbours' differences
#    instead (sections res_diff_table, res_diffs: ``differences.py``).
TILED = 4
LEARNED = 6
CONTEXT = 7
CALIBRATED = 8
INTEGER = 9
DIFFERENCES = 10
# what every model but the channel-context ones writes: the integer prior's format 9 is written on request while its
# files are still larger than the float prior's (docs/benchmarks.md)
FORMAT = DIFFERENCES
TILED_FORMATS = (TILED, tile_index.VARINT_FORMAT, LEARNED, CONTEXT, CALIBRATED, INTEGER, DIFFERENCES)
FORMATS_READ = (latents.BLOCK, latents.RANS, *TILED_FORMATS)
FORMATS_NOT_READ = {1: "fixed-rate models of visemz 0.1 (quality 1-4), whose weights are no longer shipped"}
META_KEYS = {"format", "model", "model_id", "quality", "dtype", "shape", "range", "symbols", "max_error", "residual",
             "entropy"}
TILED_KEYS = META_KEYS - {"symbols"} | {"tiles"}  # 4, 5: the grid and its parts instead of the symbol shapes
META_KEYS_OF = {latents.BLOCK: META_KEYS,
                latents.RANS: META_KEYS | {"coding"},  # format 3: each symbol section's coding
                TILED: TILED_KEYS, tile_index.VARINT_FORMAT: TILED_KEYS, LEARNED: TILED_KEYS | {"residual_id"},
                CONTEXT: TILED_KEYS | {"residual_id"}, CALIBRATED: TILED_KEYS | {"residual_id"},
                INTEGER: TILED_KEYS | {"residual_id"}, DIFFERENCES: TILED_KEYS | {"residual_id"}}
TILE_KEYS = {"size", "halo", "grid", "parts", "symbols"}
RESIDUAL_MODES = ("int", "bits", "float", "learned")
MODEL_ID = re.compile(r"[0-9a-f]{16}")  # xxh64 of the weights file, in hex: also a file name in the weights archive
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _bad(field: str, value, want: str) -> CorruptStreamError:
    return CorruptStreamError(f"image header {field} {value!r}: expected {want}")


def check(h: dict, sections: dict) -> dict:
    """Validate an image header strictly, before anything is decoded; returns it."""
    fmt = h.get("format")
    if not whole_number(fmt):
        raise _bad("format", fmt, "an integer")
    if fmt in FORMATS_NOT_READ:
        raise UnsupportedFormatError(f"image format {fmt} ({FORMATS_NOT_READ[fmt]}) is not read "
                                     f"by this build, which reads formats {list(FORMATS_READ)}")
    if fmt not in FORMATS_READ:
        raise UnsupportedFormatError(f"image format {fmt} (this build reads formats {list(FORMATS_READ)})")
    container.check_meta(h, META_KEYS_OF[fmt], KIND, fmt, DTYPES)
    meta = coded_meta(h["dtype"], _shape(h["shape"]), *_range(h["range"], h["dtype"]))
    _model(h["model"], h["model_id"], meta, fmt)
    try:
        registry.check_quality(h["quality"])
    except InvalidArgumentError:
        raise _bad("quality", h["quality"], "a number in [1, 8]") from None
    if h["entropy"] not in ENTROPIES:
        raise _bad("entropy", h["entropy"], f"one of {list(ENTROPIES)}")
    _max_error(h["max_error"], h["residual"], meta, fmt)
    if fmt >= LEARNED:
        _residual_id(h["residual_id"], h["residual"])
    if fmt in TILED_FORMATS:
        if list(sections) != [tile_index.INDEX, tile_index.TILES]:
            raise CorruptStreamError(f"tiled image has sections {list(sections)}, expected "
                                     f"{[tile_index.INDEX, tile_index.TILES]}")
        return h
    symbols = h["symbols"]
    if not (isinstance(symbols, dict) and all(isinstance(v, list) and all(whole_number(s) for s in v)
                                              for v in symbols.values())):
        raise _bad("symbols", symbols, "an object of symbol shapes")
    need = residual_sections(h["residual"], meta, fmt)
    if not need <= set(sections):
        raise CorruptStreamError(f"image lacks sections {sorted(need - set(sections))}")
    coding = h.get("coding")
    if fmt == latents.RANS and not (isinstance(coding, dict) and set(coding) == set(symbols)
                                    and all(isinstance(v, str) and v in latents.CODINGS for v in coding.values())):
        raise _bad("coding", coding, f"{list(latents.CODINGS)} for each symbol section")
    for name in sorted(latents.section_names(fmt, symbols)):
        if name not in sections:
            raise CorruptStreamError(f"image lacks the symbol section {name!r}")
    return h


def image_meta(h: dict) -> ImageMeta:
    """The coded image a checked header describes (an int16 image's uint16 twin: ``pixels.coded_meta``)."""
    return coded_meta(h["dtype"], tuple(h["shape"]), float(h["range"][0]), float(h["range"][1]))


def _shape(shape) -> tuple[int, ...]:
    if not (isinstance(shape, list) and len(shape) in (2, 3) and all(whole_number(s) and s >= 1 for s in shape)):
        raise _bad("shape", shape, "[H, W] or [H, W, C] of sizes >= 1")
    if len(shape) == 3 and shape[2] > MAX_CHANNELS:
        raise _bad("shape", shape, f"at most {MAX_CHANNELS} channels")
    check_pixels(math.prod(shape), f"image header shape {shape}")
    return tuple(shape)


def _range(rng, dtype: str) -> tuple[float, float]:
    """[lo, hi], the values 0 and 1 stand for: uint8's are always [0, 255]; uint16's two levels of 0..65535,
    int16's of -32768..32767; float32's two float32 values (what the encoder wrote: the image's own minimum and
    maximum)."""
    if not (isinstance(rng, list) and len(rng) == 2 and all(real_number(v) for v in rng) and rng[0] <= rng[1]):
        raise _bad("range", rng, "[lo, hi], two numbers with lo <= hi")
    lo, hi = float(rng[0]), float(rng[1])
    if dtype == "uint8" and (lo, hi) != (0.0, 255.0):
        raise _bad("range", rng, "[0, 255] for uint8")
    if dtype == "uint16" and not (lo.is_integer() and hi.is_integer() and 0 <= lo and hi <= 65535):
        raise _bad("range", rng, "two levels in 0..65535 for uint16")
    if dtype == "int16" and not (lo.is_integer() and hi.is_integer() and -32768 <= lo and hi <= 32767):
        raise _bad("range", rng, "two levels in -32768..32767 for int16")
    if dtype == "float32" and not all(abs(v) <= FLOAT32_MAX and float(np.float32(v)) == v for v in (lo, hi)):
        raise _bad("range", rng, "two float32 values")
    return lo, hi


def _model(name, model_id, meta: ImageMeta, fmt: int) -> None:
    if not isinstance(name, str):
        raise _bad("model", name, "a model name")
    try:
        spec = registry.parse(name)
    except InvalidArgumentError:
        raise UnsupportedFormatError(f"image header model {name!r} is not a model this build knows") from None
    if (fmt == CONTEXT) != spec.context:
        raise CorruptStreamError(f"image format {fmt} does not hold model {name!r} (format {CONTEXT} holds the "
                                 f"channel-context models {list(registry.CHANNEL_CONTEXT)}, and only them)")
    if spec.variant != meta.variant:
        raise CorruptStreamError(f"image header model {name!r} does not code {meta.channels}-channel images "
                                 f"(those use the {meta.variant!r} variant)")
    if not (isinstance(model_id, str) and MODEL_ID.fullmatch(model_id)):
        raise _bad("model_id", model_id, "16 hex digits (the weights' xxh64)")


def _max_error(e, mode, meta: ImageMeta, fmt: int) -> None:
    if e is None and mode is None:
        return
    if e is None or mode is None:
        raise CorruptStreamError(f"image header max_error {e!r} and residual {mode!r}: both null or neither")
    top = max_error_limit(meta.dtype)
    whole = meta.dtype != "float32"
    if not (real_number(e) and 0 <= e <= top and (not whole or float(e).is_integer())):
        raise _bad("max_error", e, f"{'a whole number' if whole else 'a number'} in 0..{top:g}")
    expected = residual.mode_for(meta, e)
    learned = mode == "learned" and expected == "int" and fmt >= LEARNED  # the prior codes what "int" would
    if mode not in RESIDUAL_MODES or (mode != expected and not learned):
        raise CorruptStreamError(f"image header residual {mode!r} does not match dtype {meta.dtype} and max_error {e}")


def _residual_id(residual_id, mode) -> None:
    """Format 6 and later: the residual prior's id where the residual is "learned", else null."""
    if mode == "learned" and not (isinstance(residual_id, str) and MODEL_ID.fullmatch(residual_id)):
        raise _bad("residual_id", residual_id, "16 hex digits (the residual prior's xxh64) for a learned residual")
    if mode != "learned" and residual_id is not None:
        raise _bad("residual_id", residual_id, f"null for residual {mode!r}")


def integer_prior(fmt: int) -> bool:
    """Whether a file of format ``fmt`` codes its learned residual under the integer prior (else the float one)."""
    return fmt == INTEGER


def differences(fmt: int) -> bool:
    """Whether a file of format ``fmt`` may code its sparse lossless tiles as differences (``differences.py``)."""
    return fmt >= DIFFERENCES


def calibrated(fmt: int) -> bool:
    """Whether a file of format ``fmt`` may calibrate its learned residual's scales (section res_scales)."""
    return fmt >= CALIBRATED


def residual_sections(mode: str | None, meta: ImageMeta, fmt: int) -> set[str]:
    if mode is None:
        return set()
    if mode == "learned":
        return set(residual_coder.sections(residual_coder.COLOUR if meta.variant == "rgb" else 1, calibrated(fmt),
                                           integer_prior(fmt), differences(fmt)))
    return {"mask", "residual"} | ({"exceptions", "exception_bits"} if mode == "float" else set())


def check_tiles(h: dict, height: int, width: int, symbols: list[str]) -> tiling.Grid:
    """A tiled (format 4 or 5) header's ``tiles``, against the image's padded size and the model's symbol sections."""
    t = h["tiles"]
    if not isinstance(t, dict) or set(t) != TILE_KEYS:
        raise CorruptStreamError(f"image header tiles {t!r} do not hold exactly {sorted(TILE_KEYS)}")
    size, halo, rows_cols = t["size"], t["halo"], t["grid"]
    tiling.check_tile(size, "image header tiles.size", CorruptStreamError)
    if not (isinstance(halo, list) and len(halo) == 2 and all(whole_number(v) and 0 <= v <= size for v in halo)):
        raise _bad("tiles.halo", halo, f"two sizes in 0..{size}")
    grid = tiling.Grid(size, height, width)
    if not (isinstance(rows_cols, list) and all(whole_number(v) for v in rows_cols)
            and rows_cols == [grid.rows, grid.cols]):
        raise CorruptStreamError(f"image tile grid {rows_cols!r} does not cover a {grid.height} x {grid.width} "
                                 f"padded image with tiles of {size}")
    if t["symbols"] != symbols:
        raise CorruptStreamError(f"image tile symbol sections {t['symbols']!r}: the model codes {symbols}")
    residual_parts = residual_sections(h["residual"], image_meta(h), h["format"])
    parts = sorted(latents.section_names(latents.RANS, symbols) | residual_parts)
    if t["parts"] != parts:
        raise CorruptStreamError(f"image tile parts {t['parts']!r}: expected {parts}")
    return grid


def check_sections(sections: dict, coding: dict | None, shapes: dict[str, tuple], pixels: int, what: str) -> None:
    """Every section of one tile (of a format 2 or 3 file: the whole image) against what its shapes allow,
    from the sections' headers alone, before any is decoded or any network runs: an ints stream's value
    count (exactly a symbol tensor's or the tile's ``pixels``; at most that for the lists), a conditional
    rANS stream's symbol count.  ``coding``: format 3's per-section choice (None: format 2, all ints)."""
    ints = {name: (math.prod(shape), None) for name, shape in shapes.items() if (coding or {}).get(name) != "rans"}
    ints.update({"residual": (pixels, None), "mask": (None, pixels), "exceptions": (None, pixels),
                 "exception_bits": (None, pixels), residual_coder.FIXES: (None, residual_coder.fixes_limit(pixels)),
                 residual_coder.INPUTS: (None, residual_coder.inputs_limit(_padded_pixels(shapes, pixels))),
                 residual_coder.PALETTE: (None, residual_coder.PALETTE_MAX),
                 differences_coder.TABLE: (None, differences_coder.table_limit())})
    if "y" in shapes:
        ints[latents.SCALES] = (None, 2 * math.prod(shapes["y"]))  # positions and indexes of listed scales
    for name, body in sections.items():
        try:
            _check_section(name, body, coding, shapes, ints, pixels)
        except CorruptStreamError as e:
            raise CorruptStreamError(f"{what} section {name!r}: {e}") from None


def _padded_pixels(shapes: dict[str, tuple], pixels: int) -> int:
    """At most the pixels of a tile's padded core (what the integer prior's inputs cover), from y's shape (planes,
    M, h / 16, w / 16) and up to three channels a plane; ``pixels`` where there is no y."""
    if "y" not in shapes:
        return pixels
    planes, _, h, w = shapes["y"]
    return 3 * planes * (16 * h) * (16 * w)


def _check_section(name: str, body, coding: dict | None, shapes: dict, ints: dict, pixels: int) -> None:
    if (coding or {}).get(name) == "rans":
        RL.parse(body, math.prod(shapes[name]), None)
    elif name in residual_coder.STEP_SECTIONS or name == differences_coder.DIFFS:
        n = RL.parse(body, None, None).plan.n if len(body) else 0  # a differences' stream is empty where unused
        most = pixels if name == differences_coder.DIFFS else 2 * pixels  # a pass's q >> k, and low bits where wide
        if n > most:
            raise CorruptStreamError(f"its conditional rANS stream claims {n} symbols for {pixels} pixels")
    elif name == residual_coder.SCALES:
        residual_coder.check_scales(body)
    elif name in ints and len(body):  # an empty section (no scale listed) holds no stream
        count, most = ints[name]
        parsed = stream.parse(body, count if count is not None else most)
        declared = stream.declared_count(parsed)
        if declared is not None:
            L.check_declared(declared, count, most, "its ints stream")
