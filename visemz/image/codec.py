"""ImageCodec: images <-> .vsz bytes, gluing model, block encoder and container.

    codec = ImageCodec("cuda")
    buf = codec.compress(image, model="balle2016", quality=4.5, max_error=None)
    image = codec.decompress(buf)

(``visemz.compress`` / ``visemz.decompress`` in ``visemz/api.py`` use one per device.)

``quality`` is a float in [1, 8] on CompressAI's lambda ladder (the models are variable-rate).

The model's latent symbols are the only float -> int step; everything after them is
integer coding (``latents.py``: conditional rANS with the tables shipped in the weights), so a
file written on a GPU decodes to the same symbols on a CPU.
"""

from __future__ import annotations

import copy
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from .. import config, container, cuda, defaults
from .. import device as dev
from ..encoders import encode_ints
from ..errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError
from ..models import architectures, graphs, registry, residual_weights
from ..models import weights as W
from . import image_header, latents, residual, residual_coder, tile_index, tiling
from .image_header import CONTEXT, FORMAT, FORMATS_READ, KIND, LEARNED, TILED_FORMATS  # beside the header's schema
from .pixels import (
    PAD,
    SIGNED_OFFSET,
    ImageMeta,
    as_tensor,
    check_max_error,
    coded_view,
    denormalise,
    describe,
    from_batch,
    signed_view,
)
from .refine import RefineSettings, settings_for

# quality="auto" with max_error: each variant's ladder of lossy qualities (ascending) and the rung its walk starts
# from (``_smallest_on_ladder``).  Measured on 512 x 512 crops: gray images' smallest totals came at 1 or 2 (8-bit EM
# slices: quality 1 0.3% below 2 lossless, 1.1% at E = 4; some X-rays) or higher (16-bit images, other X-rays: an
# astronomy image 2.4% below quality 4 at 6, an X-ray at E = 2 3.4%); RGB photos' at 4 or 6 (Kodak, E = 0 to 2: 4 up
# to 1% below 6 on half the crops, 0.5-2% above on the others; 8 1.6-5% above 6 on all)
AUTO_QUALITIES = {"gray": (1.0, 2.0, 4.0, 6.0, 8.0), "rgb": (4.0, 6.0, 8.0)}
AUTO_START = {"gray": 2.0, "rgb": 4.0}

_MATH_LOCK = threading.Lock()
_math_users = 0
_saved_tf32: bool | None = None


@contextmanager
def network_math():
    """The networks' math setting (cuDNN's TF32 convolutions or full float32, ``VISEMZ_TF32``) and no autograd.

    TF32 moves a float32 reconstruction by a few 1e-4 of the range, within the GPU-CPU tolerance the
    codec documents; the float64 computations (the hyperprior's scales, max_error's synthesis) do not use
    it, and the networks have no matmuls, so torch's matmul setting is left as the caller has it.  The
    switch is process-wide, so concurrent users (the pipeline's streams) share one setting: the first to
    enter sets it and the last to leave restores the caller's.
    """
    global _math_users, _saved_tf32
    with _MATH_LOCK:
        if _math_users == 0:
            _saved_tf32 = torch.backends.cudnn.allow_tf32
            torch.backends.cudnn.allow_tf32 = bool(defaults.get("tf32"))
        _math_users += 1
    try:
        with torch.inference_mode():
            yield
    finally:
        with _MATH_LOCK:
            _math_users -= 1
            if _math_users == 0:
                torch.backends.cudnn.allow_tf32 = _saved_tf32


_MODEL_LOCK = threading.Lock()
_MODEL64: dict[tuple, torch.nn.Module] = {}  # (spec, device, weights id) -> float64 copy, oldest first
_MODEL64_MAX = 16


def _model64(spec: registry.ModelSpec, device: str, model_id: str | None = None) -> torch.nn.Module:
    """A float64 copy of the model: the error-bound path's synthesis and the hyperprior's scales for rANS,
    both device-independent up to their last bits.

    Keyed by the weights' id too: weights swapped under the same spec (VISEMZ_WEIGHTS_DIR changed and
    W.load.cache_clear(), as scripts comparing checkpoints do) get their own copy, made from the very model
    whose id keys it (one load), never the old one's.  ``model_id``: the weights a file names (archived ones
    included); None, those installed."""
    net, model_id = W.load(spec, device, model_id)
    key = (spec, device, model_id)
    with _MODEL_LOCK:  # one copy per (spec, device, weights), even when several streams ask at once
        if key not in _MODEL64:
            if len(_MODEL64) >= _MODEL64_MAX:
                del _MODEL64[next(iter(_MODEL64))]
            _MODEL64[key] = _float64_copy(net, device)
        return _MODEL64[key]


_model64.cache_clear = _MODEL64.clear  # type: ignore[attr-defined]


def _float64_copy(net: torch.nn.Module, device: str) -> torch.nn.Module:
    # built outside inference mode (the callers run in it), as W.load builds the model: its parameters are
    # then ordinary tensors with version counters, so its gain units cache their gains (GainUnits.at)
    with torch.inference_mode(False):
        net64 = architectures.freeze_gdn(copy.deepcopy(net).double())
    if torch.device(device).type == "cuda":
        graphs.synchronize(device)  # the copy ran on this thread's stream; others must see it done
    return net64


class ImageCodec:
    """Compress and decompress images with one device and entropy setting."""

    def __init__(self, device: str | None = None, entropy: str = "zstd", bitshuffle: bool = True):
        self.device = cuda.resolve(device)
        self.enc = {"entropy": entropy, "bitshuffle": bitshuffle}
        encode_ints(np.zeros(0, np.int32), **self.enc)  # validates the options now, naming a bad one

    # ------------------------------------------------------------------ compress
    def compress(self, image, *, model: str = registry.DEFAULT_MODEL, quality: float = registry.DEFAULT_QUALITY,
                 max_error=None, image_format: int | None = None, tile: int | None = None,
                 refine: int | RefineSettings | None = None) -> bytes:
        """``tile``: the core tile size in pixels (a multiple of 64; default ``VISEMZ_TILE``): an image
        larger than one tile is compressed tile by tile, a batch of tiles at a time on the device, so
        a NumPy image stays in host memory.  ``image_format=2`` or ``3`` writes a previous format (one
        tile, block-coded or rANS-coded symbols), for comparisons and compatibility tests.
        ``image_format`` None: the model's format (7 for a channel-context model, else 8; 9, the integer residual
        prior, on request).
        ``refine``: steps of encoder-side latent refinement (0..10000; default ``VISEMZ_REFINE``, 0:
        none; or a ``refine.RefineSettings``): each step costs a forward and backward pass of the
        synthesis on the image, and the decoder and the format are unchanged (``refine.py``).  With
        ``max_error`` the residual is taken against the refined symbols' reconstruction, so the
        bound holds as ever.  ``quality="auto"`` (with ``max_error`` only) walks its variant's ladder of
        ``AUTO_QUALITIES`` from ``AUTO_START`` (``_smallest_on_ladder``) and keeps the smallest file: the lossy part's
        bits against the residual's.
        With ``max_error`` > 0 an integer image whose values are sparse within their span (16-bit data stretched
        from fewer levels...) is also coded losslessly, and the smaller file kept (its header then says 0)."""
        if image_format is not None and image_format not in FORMATS_READ:
            raise InvalidArgumentError(f"image_format={image_format!r}: this build writes {list(FORMATS_READ)}")
        if quality == "auto" and max_error is None:
            raise InvalidArgumentError('quality="auto" chooses between lossy qualities for max_error: give max_error')
        t, signed = coded_view(self._tensor(image))
        meta = describe(t)
        e = check_max_error(max_error, meta.dtype)
        q = registry.check_quality(AUTO_START[meta.variant] if quality == "auto" else quality)
        rungs = AUTO_QUALITIES[meta.variant] if quality == "auto" else (q,)
        # a sparse image's lossless file codes indexes into its values (residual_coder's palette) or its differences,
        # which a bounded error cannot use: it is often the smaller file, and it keeps any bound (formats from 6: the
        # block-coded residual of earlier ones has neither)
        also_lossless = bool(e) and (image_format is None or image_format >= LEARNED) and _sparse_values(t, meta)
        kw = dict(model=model, image_format=image_format, tile=tile, refine=refine, signed=signed)

        def file_at(q: float) -> bytes:
            best = self._compress(t, meta, q, e, **kw)
            # through the palette only: in the levels a lossless file codes the bounded one's bins and more
            if also_lossless:
                best = min(best, self._compress(t, meta, q, 0, levels_too=False, **kw), key=len)
            return best

        return _smallest_on_ladder(file_at, rungs, q)

    def _tensor(self, image) -> torch.Tensor:
        """The image as a torch tensor: a NumPy image stays in host memory (tiles go to the device a batch at a
        time), any other where it is or on this codec's device."""
        return as_tensor(image, "cpu" if isinstance(image, np.ndarray) else self.device)

    def _compress(self, t: torch.Tensor, meta: ImageMeta, q: float, e, *, model: str, image_format: int | None,
                  tile: int | None, refine, signed: str | None = None, levels_too: bool = True) -> bytes:
        """One file of ``t`` at checked quality ``q`` and bound ``e`` (``check_max_error``'s: levels, or None);
        ``signed``: the signed dtype ``t`` is the coded view of (``coded_view``), which the header names;
        ``levels_too`` as ``residual_coder.encode``'s."""
        tile = defaults.get("tile") if tile is None else tiling.check_tile(tile)
        refining = settings_for(defaults.get("refine") if refine is None else refine)
        spec = registry.spec(model, meta.variant)
        image_format = _format_for(spec, image_format, refining)
        net, model_id = W.load(spec, self.device)
        tiled = image_format in TILED_FORMATS
        grid = tiling.grid_for(meta, tile if tiled else None)
        coded = latents.RANS if tiled else image_format
        with network_math():
            net64 = _model64(spec, self.device) if e is not None or coded == latents.RANS else None
            analysed = tiling.analyse(net, t, meta, q, grid, defaults.get("tile_batch"), self.device, refining)
            tiles, waiting = [], {}  # each tile's (sections, coding); symbols coded, not yet synthesised

            def symbols_of(i: int) -> dict[str, torch.Tensor]:
                """Tile i's symbols: tiles are analysed and coded in order up to it.  The residual's synthesis
                asks for each tile's once, when it first needs the tile's latent (after the tiles before it, a
                neighbour row ahead), so only a band of tiles' symbols waits here, not the whole image's."""
                while i not in waiting:
                    j, symbols = next(analysed)
                    tiles.append(latents.encode(coded, net, net64, symbols, q, self.enc))
                    waiting[j] = symbols
                return waiting.pop(i)

            mode = None if e is None else residual.mode_for(meta, e)
            res = self._residual_prior(spec, mode, image_format)
            mode = "learned" if res is not None else mode
            if e is not None:
                pixels = self._tile_pixels(net, net64, q, meta, grid, range(grid.count), symbols_of, True, res)
                for i, box, x01 in pixels:
                    x = t[box[0]:box[1], box[2]:box[3]].to(self.device)
                    tm = tiling.tile_meta(meta, box)
                    extra = residual.encode(x, x01, tm, e, **self.enc)[0] if res is None else \
                        residual_coder.encode(res, x, x01, tm, e, levels_too, image_header.calibrated(image_format),
                                              image_header.differences(image_format))
                    tiles[i][0].update(extra)
            for i in range(len(tiles), grid.count):  # without max_error: every tile, coded and dropped
                symbols_of(i)
        shift = SIGNED_OFFSET[signed] if signed else 0  # the header speaks of the image's own levels
        header = {
            "format": image_format, "model": spec.name, "model_id": model_id, "quality": q,
            "dtype": signed or meta.dtype, "shape": list(meta.shape), "range": [meta.lo - shift, meta.hi - shift],
            "max_error": e, "residual": mode, "entropy": self.enc["entropy"],
        }
        if image_format >= LEARNED:
            header["residual_id"] = None if res is None else res.model_id
        if not tiled:
            sections, coding = tiles[0]
            shapes = architectures.latent_shapes(net, *_batch_and_padded(meta))
            header["symbols"] = {k: list(v) for k, v in shapes.items()}
            if coding is not None:
                header["coding"] = coding
            return container.pack(KIND, header, sections)
        parts, names = sorted(tiles[0][0]), list(tiles[0][1])
        header["tiles"] = {"size": grid.size, "halo": list(tiling.ANALYSIS_HALO), "grid": [grid.rows, grid.cols],
                           "parts": parts, "symbols": names}
        return container.pack(KIND, header, tile_index.pack(parts, names, tiles, image_format))

    def _residual_prior(self, spec: registry.ModelSpec, mode: str | None,
                        image_format: int) -> residual_weights.Residual | None:
        """The residual prior that codes an integer image's max_error residual (formats 6 to 9: the integer one from
        9), or None: the block-coded residual of formats 2-5, for float32 images and where no prior fits the model."""
        if mode != "int" or image_format < LEARNED:
            return None
        res = residual_weights.load(spec.variant, self.device, image_header.integer_prior(image_format))
        return res if res is not None and res.lossy_model == spec.name and res.features == spec.N else None

    # ---------------------------------------------------------------- decompress
    def decode_symbols(self, buf) -> dict[str, torch.Tensor]:
        """.vsz bytes (or the ``container.Container`` unpacked from them) -> the latent symbols it holds
        ({"y": ..., ["z": ...]}, int32 on this codec's device); a tiled file's tiles assembled into the whole
        image's latents."""
        grid, tiles = self.decode_tile_symbols(buf)
        return {k: tiling.assemble(grid, lambda i: tiles[i][k], grid.size // stride)
                for k, stride in (("y", tiling.STRIDE), ("z", PAD)) if k in tiles[0]}

    def decode_tile_symbols(self, buf) -> tuple[tiling.Grid, list[dict[str, torch.Tensor]]]:
        """.vsz bytes or container -> (its tile grid, each tile's symbols); files of formats 2 and 3 are one tile."""
        f = self._open(buf)
        with network_math():
            return f.grid, [f.symbols(i) for i in range(f.grid.count)]

    def decompress_tensor(self, buf, region=None) -> torch.Tensor:
        """.vsz bytes or container -> the image (or its ``region``, (y0, y1, x0, x1)) as a torch tensor on this
        codec's device."""
        return self._decode(buf, region, host=False)

    def decompress(self, buf, region=None) -> np.ndarray:
        """.vsz bytes -> the image as a NumPy array of the original dtype and shape, or only its ``region``
        (y0, y1, x0, x1): then only the tiles that region needs are decoded.

        ``buf`` may be the ``container.Container`` already unpacked from the bytes (``pages.decode`` passes
        it), whose checksums ``container.unpack`` checked: they are not checked again.  Bytes are unpacked
        here, each checksum checked once; a region read checks them all too (the header's and every
        section's, the tiles it does not decode included: damage anywhere is ``CorruptStreamError``)."""
        return self._decode(buf, region, host=True)

    def _decode(self, buf, region, host: bool):
        f = self._open(buf)
        return signed_view(self._decode_file(f, region, host), f.header["dtype"])

    def _decode_file(self, f: "_File", region, host: bool):
        """The coded image's pixels (``coded_view``'s: uint16 for an int16 file) of ``region`` or the whole."""
        meta, h = f.meta, f.header
        box = config.check_region(region, meta.shape) if region is not None else (0, meta.height, 0, meta.width)
        shape = (box[1] - box[0], box[3] - box[2], *meta.shape[2:])
        e, mode = h["max_error"], h["residual"]
        out = None
        with network_math():
            if region is not None and mode is None and tiling.fits_one_synthesis(f.grid, box):
                px = self._box_pixels(f, box)
                return dev.as_numpy(px) if host else px
            pixels = self._tile_pixels(f.net, f.net64, h["quality"], meta, f.grid, f.grid.touching(box),
                                       f.symbols, mode is not None, f.residual)
            for i, tbox, x01 in pixels:
                tm = tiling.tile_meta(meta, tbox)
                if mode is None:
                    px = denormalise(x01, tm)
                elif f.residual is not None:
                    px = residual_coder.decode(f.residual, f.tile(i)[0], x01, tm, e)
                else:
                    px = residual.decode(f.tile(i)[0], x01, tm, e, mode)
                if tbox == box:  # one tile is the whole answer
                    return dev.as_numpy(px) if host else px
                if out is None:
                    out = np.empty(shape, meta.dtype) if host else \
                        torch.empty(shape, dtype=px.dtype, device=px.device)
                y0, y1, x0, x1 = max(tbox[0], box[0]), min(tbox[1], box[1]), max(tbox[2], box[2]), min(tbox[3], box[3])
                part = px[y0 - tbox[0]:y1 - tbox[0], x0 - tbox[2]:x1 - tbox[2]]
                out[y0 - box[0]:y1 - box[0], x0 - box[2]:x1 - box[2]] = dev.as_numpy(part) if host else part
        return out

    def _box_pixels(self, f: "_File", box) -> torch.Tensor:
        """A region of a lossy file (no residual) from a synthesis of the region alone (float32)."""
        tm = tiling.tile_meta(f.meta, box)
        latent_of = _dequantiser(f.net, f.symbols, f.header["quality"], torch.float32)
        return denormalise(from_batch(tiling.synthesise_box(f.net, f.grid, box, latent_of), tm), tm)

    def _tile_pixels(self, net, net64, q: float, meta: ImageMeta, grid: tiling.Grid, tiles, symbols_of, f64: bool,
                     res: residual_weights.Residual | None = None):
        """(tile, its box in the image, its pixels in [0, 1] in image layout) for ``tiles``, synthesised in
        float64 (``f64``, the error-bound path) or float32 from ``symbols_of(i)``, tile i's symbols (asked
        for once per tile whose latent the synthesis needs, the tiles around ``tiles`` included).  With a
        residual prior ``res`` (float64) the pixels are the core's (reconstruction, reduced features) in
        batch layout, what ``residual_coder`` takes."""
        model, dtype = (net64, torch.float64) if f64 else (net, torch.float32)
        latent_of = _dequantiser(model, symbols_of, q, dtype)
        reduce = None if res is None else res.reduce
        for i, x in tiling.synthesise(model, grid, list(tiles), latent_of, defaults.get("tile_batch"), reduce=reduce):
            box = tiling.pixel_box(grid, i, meta)
            out = list(x) if res is not None else from_batch(x, tiling.tile_meta(meta, box))
            del x  # the residual coder consumes the features from ``out``: nothing else may hold them
            yield i, box, out

    def _open(self, buf) -> "_File":
        """Parse and check a file (bytes, or a container unpacked from them): its header, image meta, grid,
        weights and where each tile's parts lie."""
        c = buf if isinstance(buf, container.Container) else container.unpack(buf)
        if c.kind != KIND:
            raise UnsupportedFormatError(f"container holds {c.kind!r}, not an image")
        h = image_header.check(c.meta, c.sections)
        spec = registry.parse(h["model"])
        meta = image_header.image_meta(h)
        net, _ = W.load(spec, self.device, h["model_id"])  # the weights the file names, archived ones included
        batch, ph, pw = _batch_and_padded(meta)
        want = architectures.latent_shapes(net, batch, ph, pw)
        if h["format"] in TILED_FORMATS:
            names = latents.symbol_sections(net)
            grid = image_header.check_tiles(h, ph, pw, names)
            index = tile_index.TileIndex(c.sections, grid.count, h["tiles"]["parts"], names, h["format"])
            tile_of = lambda i: (index.sections(i), index.coding(i))  # noqa: E731
            rans = any(v == "rans" for i in range(grid.count) for v in index.coding(i).values())
        else:
            grid = tiling.grid_for(meta, None)
            if {k: list(v) for k, v in want.items()} != h["symbols"]:
                raise CorruptStreamError(f"symbol shapes {h['symbols']} do not fit a {meta.shape} image and "
                                         f"{spec.name}")
            tile_of = lambda i: (c.sections, h.get("coding"))  # noqa: E731
            rans = bool(latents.rans_sections(h))
        for i in range(grid.count):  # every section's declared size, before any is decoded or any network runs
            y0, y1, x0, x1 = tiling.pixel_box(grid, i, meta)
            image_header.check_sections(*tile_of(i), latents.section_shapes(net, _tile_shapes(net, meta, grid, i)),
                                        (y1 - y0) * (x1 - x0) * meta.channels, f"tile {i}")
        net64 = _model64(spec, self.device, h["model_id"]) if rans or h["residual"] is not None else None
        return _File(self.device, h, meta, grid, net, net64, tile_of, _learned_prior(h, spec, self.device))


def _sparse_values(t: torch.Tensor, meta: ImageMeta) -> bool:
    """Whether an integer image's values are sparse within their own span (``residual_coder.sparse``)."""
    if meta.dtype not in ("uint8", "uint16"):
        return False
    present = torch.nonzero(torch.bincount(t.reshape(-1).to(torch.int32))).reshape(-1)
    return residual_coder.sparse(present.numel(), int(present[0]), int(present[-1]))


def _format_for(spec: registry.ModelSpec, image_format: int | None, refining) -> int:
    """The image format a model writes (``image_format`` None: its own), or InvalidArgumentError: format 7 holds
    channel-context models and nothing else, and they have no refinement yet."""
    own = CONTEXT if spec.context else FORMAT
    if image_format is not None and (image_format == CONTEXT) != spec.context:
        raise InvalidArgumentError(f"image_format={image_format}: model {spec.arch} writes format {own}"
                                   + ("" if spec.context
                                      else f" (or {[f for f in FORMATS_READ if f != CONTEXT]} on request)"))
    if spec.context and refining is not None:
        raise InvalidArgumentError(f"refine: model {spec.arch} has no encoder-side refinement; use refine=0")
    return own if image_format is None else image_format


def _dequantiser(model, symbols_of, q: float, dtype):
    """i -> tile i's latent as g_s takes it (``symbols_of(i)`` dequantised in ``dtype``)."""
    def latent_of(i: int) -> torch.Tensor:
        symbols = symbols_of(i)
        names = sorted(symbols)  # "y" and, for a hyperprior model, "z"
        return graphs.run(lambda *t: architectures.dequantise(model, dict(zip(names, t)), q, dtype),
                          tuple(symbols[k] for k in names), key=("dequantise", float(q), dtype, tuple(names)),
                          owner=model, pixels=graphs.pixels(symbols["y"], tiling.STRIDE),
                          keep=lambda: architectures.gains(model, q, dtype, symbols["y"].device))

    return latent_of


@dataclass(frozen=True)
class _File:
    """An opened image file: what decoding any of its tiles needs."""

    device: str
    header: dict
    meta: ImageMeta
    grid: tiling.Grid
    net: torch.nn.Module
    net64: torch.nn.Module | None
    tile: object  # i -> (sections, coding) of tile i
    residual: residual_weights.Residual | None  # the residual prior of a "learned" residual

    def symbols(self, i: int) -> dict[str, torch.Tensor]:
        return _tile_symbols(self.net, self.net64, self.header["quality"], self.device, self.meta, self.grid, i,
                             *self.tile(i))


def _tile_symbols(net, net64, q: float, device: str, meta: ImageMeta, grid: tiling.Grid, i: int, sections,
                  coding) -> dict[str, torch.Tensor]:
    """Tile i's symbols from its sections (``coding``: the format-3 choice per section; None for format 2)."""
    return latents.decode(net, net64, sections, _tile_shapes(net, meta, grid, i), q, device, coding)


def _tile_shapes(net, meta: ImageMeta, grid: tiling.Grid, i: int) -> dict[str, tuple]:
    """The symbol tensors' shapes of tile i."""
    y0, y1, x0, x1 = grid.core(i)
    return architectures.latent_shapes(net, _batch_and_padded(meta)[0], y1 - y0, x1 - x0)


def _learned_prior(h: dict, spec: registry.ModelSpec, device: str) -> residual_weights.Residual | None:
    """The residual prior a file's "learned" residual names (None for other files), installed or archived, or
    UnsupportedFormatError."""
    if h["residual"] != "learned":
        return None
    return residual_weights.load(spec.variant, device, image_header.integer_prior(h["format"]), h["residual_id"])


def _smallest_on_ladder(file_at, rungs: tuple[float, ...], start: float) -> bytes:
    """The smallest of the files ``file_at(q)`` along the ascending qualities ``rungs``: ``start`` and the rung above
    it, then on up while each next rung gives a smaller file; where the rung above gave none smaller, down from
    ``start`` alike (a noisy image's residual pays for a better reconstruction less than its lossy bits cost).
    Holds two files at a time, never the whole walk's."""
    i = rungs.index(start)
    best = file_at(rungs[i])
    if i + 1 == len(rungs):
        return best
    above = file_at(rungs[i + 1])
    step, j = (1, i + 1) if len(above) < len(best) else (-1, i)
    best = min(best, above, key=len)
    while 0 <= j + step < len(rungs):
        j += step
        f = file_at(rungs[j])
        if len(f) >= len(best):
            break  # the ladder stopped paying
        best = f
    return best


def _batch_and_padded(meta: ImageMeta) -> tuple[int, int, int]:
    batch = 1 if meta.channels == 3 or len(meta.shape) == 2 else meta.channels
    return (batch, *meta.padded)


