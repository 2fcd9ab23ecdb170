"""Tiles: an image as a grid of core tiles that the network sees one batch of tiles at a time.

Analysis: a tile's latent core (T/16 x T/16 positions) is g_a's output on the tile plus a halo of
real neighbouring pixels, cropped to the core.  Latent position m depends on pixels 16m - 30 ..
16m + 30 (four stride-2 5x5 convolutions; GDN works per position), so a halo of 32 pixels before
and 16 after (rounded up to the stride 16, keeping the window on the latent grid) gives the latent
of the whole image, up to float rounding; zero padding happens only at the image's own border,
where the whole image has it too.  The hyperprior then runs on the core alone, so every tile's
symbols decode on their own.

Synthesis: pixel p depends on latent positions (p - 30) / 16 .. (p + 30) / 16 (four stride-2 5x5
transposed convolutions), so a tile's pixels need its latent plus 1 position before and 2 after,
taken from the neighbouring tiles' decoded latents: the whole image's reconstruction of those
latents, exactly the same computation whichever region asks for the tile.

The image is edge-padded to multiples of 64 (``pixels.PAD``) as a whole, and tiles cut that
padded image: a grid of ceil(Hp / T) x ceil(Wp / T) cores of T x T, the last row and column
shorter (still multiples of 64).  One tile of the padded image's size is the untiled codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from .. import config, defaults
from ..errors import InvalidArgumentError, VisemzError
from ..models import architectures, blocks, graphs
from .pixels import PAD, ImageMeta, to_batch
from .refine import RefineSettings, refine_symbols

MAX_TILE = 1 << 15  # the largest core tile in pixels, written or read (docs/FORMAT.md, section 4.3)
STRIDE = architectures.STRIDE  # pixels per latent position
ANALYSIS_HALO = (32, 16)  # pixels before / after a core that g_a needs (30 and 14, on the stride grid)
SYNTHESIS_HALO = (1, 2)  # latent positions before / after a core that g_s needs

Box = tuple[int, int, int, int]  # y0, y1, x0, x1 (ends exclusive)


@dataclass(frozen=True)
class Grid:
    """Core tiles of ``size`` pixels over a padded image of ``height`` x ``width`` (multiples of 64)."""

    size: int
    height: int
    width: int

    @property
    def rows(self) -> int:
        return -(-self.height // self.size)

    @property
    def cols(self) -> int:
        return -(-self.width // self.size)

    @property
    def count(self) -> int:
        return self.rows * self.cols

    def core(self, i: int) -> Box:
        """Tile i's core in padded pixels (tiles in row-major order)."""
        r, c = divmod(i, self.cols)
        return (r * self.size, min((r + 1) * self.size, self.height),
                c * self.size, min((c + 1) * self.size, self.width))

    def analysis_window(self, i: int) -> tuple[Box, Box]:
        """(pixel window g_a runs on, the core within its output in latent positions)."""
        y0, y1, x0, x1 = self.core(i)
        (b, a), h, w = ANALYSIS_HALO, self.height, self.width
        win = (max(0, y0 - b), min(h, y1 + a), max(0, x0 - b), min(w, x1 + a))
        return win, _within(self.core(i), win, STRIDE)

    def synthesis_window(self, i: int) -> tuple[Box, Box]:
        """(latent window g_s runs on, the core within its output in pixels)."""
        core = tuple(v // STRIDE for v in self.core(i))
        (b, a), lh, lw = SYNTHESIS_HALO, self.height // STRIDE, self.width // STRIDE
        win = (max(0, core[0] - b), min(lh, core[1] + a), max(0, core[2] - b), min(lw, core[3] + a))
        return win, tuple(v * STRIDE for v in _within(core, win, 1))

    def touching(self, box: Box, scale: int = 1) -> list[int]:
        """Tiles whose core meets ``box`` (in units of ``scale`` pixels), row-major."""
        y0, y1, x0, x1 = (v * scale for v in box)
        rows = range(y0 // self.size, -(-y1 // self.size))
        cols = range(x0 // self.size, -(-x1 // self.size))
        return [r * self.cols + c for r in rows for c in cols]


def _within(inner: Box, outer: Box, unit: int) -> Box:
    return ((inner[0] - outer[0]) // unit, (inner[1] - outer[0]) // unit,
            (inner[2] - outer[2]) // unit, (inner[3] - outer[2]) // unit)


def grid_for(meta: ImageMeta, tile: int | None) -> Grid:
    """The grid of an image: cores of ``tile`` pixels, or one tile when ``tile`` is None."""
    ph, pw = meta.padded
    return Grid(tile if tile is not None else max(ph, pw), ph, pw)


def check_tile(tile, name: str = "tile", error: type[VisemzError] = InvalidArgumentError) -> int:
    """``tile`` if it is a core tile size, a multiple of 64 pixels in 64..MAX_TILE, else ``error`` naming
    ``name`` and the value: the one rule of the writer (an argument: ``InvalidArgumentError``), the reader
    (a header: ``CorruptStreamError``) and ``VISEMZ_TILE``, so that every file written is read back."""
    if not config.whole_number(tile) or tile % PAD or not PAD <= tile <= MAX_TILE:
        raise error(f"{name}={tile!r}: expected a multiple of {PAD} pixels in {PAD}..{MAX_TILE}")
    return int(tile)


# the tile rule is this module's (config.RULES says why), so VISEMZ_TILE is checked here, when tiling is
# imported; defaults.set checks a program's value itself
check_tile(defaults.get("tile"), "VISEMZ_TILE")


def _batches(tiles: list[int], key: Callable[[int], object], size: int) -> list[list[int]]:
    """Consecutive tiles with the same window (same ``key``), at most ``size`` per batch."""
    out: list[list[int]] = []
    for i in tiles:
        if out and len(out[-1]) < size and key(out[-1][0]) == key(i):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _window_key(window: Callable[[int], tuple[Box, Box]]) -> Callable[[int], object]:
    def key(i: int):
        (y0, y1, x0, x1), crop = window(i)
        return (y1 - y0, x1 - x0, crop)

    return key


def _split(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(t.chunk(n)) if n > 1 else [t]


def analyse(net, t: torch.Tensor, meta: ImageMeta, quality: float, grid: Grid, batch: int, device: str,
            refine: RefineSettings | None = None) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(tile, its symbols) for every tile, in row-major order; the tiles' pixels move to ``device``
    a batch at a time (``t`` may stay on the host).  ``refine``: refine each batch's core latents
    against the tiles' core pixels first (``refine.py``; None: the analysis's own symbols)."""
    for group in _batches(list(range(grid.count)), _window_key(grid.analysis_window), batch):
        win, crop = grid.analysis_window(group[0])
        whole = crop == (0, (win[1] - win[0]) // STRIDE, 0, (win[3] - win[2]) // STRIDE)
        x = torch.cat([to_batch(t, meta, grid.analysis_window(i)[0], device) for i in group])
        crop = None if whole else crop
        if refine is None:
            symbols = graphs.run(lambda v: architectures.analyse(net, v, quality, crop), (x,),
                                 key=("analyse", float(quality), crop), owner=net, pixels=graphs.pixels(x),
                                 keep=lambda: architectures.gains(net, quality, x.dtype, x.device))
        else:
            planes = x.shape[0] // len(group)
            valid = [_real_size(grid, i, meta) for i in group for _ in range(planes)]
            symbols = refine_symbols(net, x, quality, crop, valid, refine)
        parts = {k: _split(v, len(group)) for k, v in symbols.items()}
        for n, i in enumerate(group):
            yield i, {k: v[n] for k, v in parts.items()}


def _real_size(grid: Grid, i: int, meta: ImageMeta) -> tuple[int, int]:
    """(height, width) of tile i's core that lies in the image, not in its edge padding."""
    y0, y1, x0, x1 = pixel_box(grid, i, meta)
    return y1 - y0, x1 - x0


def park_on_host(t: torch.Tensor) -> torch.Tensor:
    """A latent waiting between batches: a device tensor copied to pinned host memory (copies both ways run
    at the link's full speed), a host tensor as it is."""
    if t.device.type == "cpu":
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)


class _Latents:
    """Decoded latents of tiles, each computed once, at its first use, and held until the last batch that
    needs it.  ``release(b)`` after batch b's latents are assembled drops those no later batch needs and
    hands the others to ``park`` (``park_on_host``: host memory), so that the device holds one batch's
    latents at a time, not the band of about two rows of tiles that waits for later batches."""

    def __init__(self, latent_of: Callable[[int], torch.Tensor], last_use: dict[int, int],
                 park: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.latent_of, self.last_use, self.park, self.held = latent_of, last_use, park, {}
        self.parked: set[int] = set()

    def get(self, i: int) -> torch.Tensor:
        if i not in self.held:
            self.held[i] = self.latent_of(i)
        return self.held[i]

    def release(self, batch: int) -> None:
        for i in list(self.held):
            if self.last_use[i] <= batch:
                del self.held[i]
                self.parked.discard(i)
            elif self.park is not None and i not in self.parked:
                self.held[i] = self.park(self.held[i])
                self.parked.add(i)


def assemble(grid: Grid, tile: Callable[[int], torch.Tensor], size: int, win: Box | None = None,
             device: torch.device | None = None) -> torch.Tensor:
    """A window (default: all) of a tensor cut into the grid's tiles, from the tiles it covers;
    ``tile(i)`` is tile i's part (B, C, h, w), ``size`` the tile size in its units.  ``device``: where
    the window is put together (each tile's piece is copied there, so a tile held in host memory moves
    only the part the window takes); None: where the tiles are."""
    rows_end, cols_end = -(-grid.height * size // grid.size), -(-grid.width * size // grid.size)
    y0, y1, x0, x1 = win or (0, rows_end, 0, cols_end)
    rows = []
    for r in range(y0 // size, -(-y1 // size)):
        pieces = []
        for c in range(x0 // size, -(-x1 // size)):
            t = tile(r * grid.cols + c)
            piece = t[:, :, max(y0 - r * size, 0):y1 - r * size, max(x0 - c * size, 0):x1 - c * size]
            pieces.append(piece if device is None else piece.to(device))
        rows.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, 3))
    return rows[0] if len(rows) == 1 else torch.cat(rows, 2)


def synthesise(net, grid: Grid, tiles: list[int], latent_of: Callable[[int], torch.Tensor], batch: int,
               park: Callable[[torch.Tensor], torch.Tensor] | None = park_on_host,
               reduce: torch.nn.Module | None = None) -> Iterator[tuple[int, object]]:
    """(tile, its core's reconstruction (B, C, h, w), unclipped) for ``tiles``, in their order.

    ``latent_of(i)``: tile i's dequantised latent (``architectures.dequantise``), in the dtype the
    synthesis runs in; each is computed once and dropped after the last batch that needs it.  Between
    the batches that need it, it waits where ``park`` puts it (default: host memory), so that GPU memory
    follows the tile batch, not the width of the image; the pixels are the same wherever it waits.
    ``reduce`` (the residual prior's reduction of g_s's last hidden features): each tile's part is then
    (reconstruction, reduced features at half resolution), from ``synthesis_features``."""
    groups = _batches(tiles, _window_key(grid.synthesis_window), batch)
    last_use = {j: b for b, group in enumerate(groups) for i in group
                for j in grid.touching(grid.synthesis_window(i)[0], STRIDE)}
    latents, s = _Latents(latent_of, last_use, park), grid.size // STRIDE
    device = next(net.g_s.parameters()).device
    for b, group in enumerate(groups):
        y = torch.cat([assemble(grid, latents.get, s, grid.synthesis_window(i)[0], device) for i in group])
        latents.release(b)  # before g_s: its activations are the peak, and no held latent need sit beside them
        y0, y1, x0, x1 = grid.synthesis_window(group[0])[1]
        if reduce is None:
            x = synthesis(net, y)
            if (y0, x0, y1, x1) != (0, 0, x.shape[2], x.shape[3]):
                x = x[:, :, y0:y1, x0:x1]
            yield from zip(group, _split(x, len(group)))
            continue
        x, r = synthesis_features(net, reduce, y)
        parts = list(zip(group, zip(_split(x[:, :, y0:y1, x0:x1], len(group)),
                                    _split(r[:, :, y0 // 2:y1 // 2, x0 // 2:x1 // 2], len(group)))))
        del x, r  # handed on alone: the residual coder drops the features once it has used them
        while parts:
            yield parts.pop(0)


def synthesis(net, y: torch.Tensor) -> torch.Tensor:
    """g_s(y): on a GPU from a CUDA graph where ``graphs.usable``; on the CPU block by block where the latent
    is large (``models/blocks.py``), so that host memory follows a block, not the tile."""
    if y.is_cuda:
        return graphs.run(net.g_s, (y,), key=("g_s",), owner=net, pixels=graphs.pixels(y, STRIDE))
    plan = blocks.plan(y.shape[2], y.shape[3], *SYNTHESIS_HALO, _synthesis_unit(net, y), y.device)
    return blocks.run(lambda r, c: (net.g_s(y[:, :, r[0]:r[1], c[0]:c[1]]),), plan, (STRIDE,))[0]


def _synthesis_unit(net, y: torch.Tensor, im2col: bool = True) -> int:
    """g_s's working memory per latent position: its widest im2col buffer (N x 5 x 5 values at each of its
    4 x 4 quarter-resolution positions); without im2col (conv64's kernels), a layer's input and output and
    one more buffer of N channels at its (STRIDE / 2)**2 half-resolution positions."""
    per_value = y.element_size() * y.shape[0]
    n = net.g_s[-1].in_channels
    return (n * 25 * 16 if im2col else 3 * n * (STRIDE // 2) ** 2) * per_value


def synthesis_features(net, reduce: torch.nn.Module, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g_s(y), ``reduce`` of g_s's last hidden features at half resolution): the float64 synthesis the residual
    coder needs, block by block (``models/blocks.py``) with SYNTHESIS_HALO latent positions of context, so that
    memory follows a block: a float64 transposed convolution's im2col buffer over a whole X-ray would take
    gigabytes."""
    head, last, reducer = net.g_s[:-1], net.g_s[-1:], torch.nn.Sequential(reduce)
    unit = _synthesis_unit(net, y, im2col=not architectures.implicit_gemm_on(y))
    plan = blocks.plan(y.shape[2], y.shape[3], *SYNTHESIS_HALO, unit, y.device)

    def forward(layers: torch.nn.Sequential, t: torch.Tensor) -> torch.Tensor:
        return architectures.native_forward(layers, t, implicit_gemm=True) if t.is_cuda else layers(t)

    def window(rows, cols):
        features = forward(head, y[:, :, rows[0]:rows[1], cols[0]:cols[1]])
        return forward(last, features), forward(reducer, features)

    return blocks.run(window, plan, (STRIDE, STRIDE // 2))


def box_window(grid: Grid, box: Box) -> tuple[Box, Box]:
    """(latent window g_s runs on for a pixel ``box`` of the padded image, the box within its output).

    The latent positions under the box, widened to whole positions, plus the synthesis halo: each
    of those pixels sees exactly the latents it sees in its own tile's synthesis window."""
    core = (box[0] // STRIDE, -(-box[1] // STRIDE), box[2] // STRIDE, -(-box[3] // STRIDE))
    (b, a), lh, lw = SYNTHESIS_HALO, grid.height // STRIDE, grid.width // STRIDE
    win = (max(0, core[0] - b), min(lh, core[1] + a), max(0, core[2] - b), min(lw, core[3] + a))
    y, x = win[0] * STRIDE, win[2] * STRIDE
    return win, (box[0] - y, box[1] - y, box[2] - x, box[3] - x)


def fits_one_synthesis(grid: Grid, box: Box) -> bool:
    """Whether a pixel box is at most one tile high and wide: its own synthesis costs no more GPU
    memory than a tile's, and less work than the (up to four) tiles it touches."""
    return box[1] - box[0] <= grid.size and box[3] - box[2] <= grid.size


def synthesise_box(net, grid: Grid, box: Box, latent_of: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """The reconstruction (B, C, h, w), unclipped, of a pixel ``box`` alone: g_s on the latents under it
    and their halo, cut from the tiles they lie in (``latent_of`` as in ``synthesise``), so that
    a small region of a large file costs a synthesis of its own size, not of whole tiles."""
    win, (y0, y1, x0, x1) = box_window(grid, box)
    latents = _Latents(latent_of, {})  # each touched tile's latent computed once, all dropped on return
    x = synthesis(net, assemble(grid, latents.get, grid.size // STRIDE, win))
    return x[:, :, y0:y1, x0:x1]


def pixel_box(grid: Grid, i: int, meta: ImageMeta) -> Box:
    """Tile i's core within the image itself (the padding cut off)."""
    y0, y1, x0, x1 = grid.core(i)
    return y0, min(y1, meta.height), x0, min(x1, meta.width)


def tile_meta(meta: ImageMeta, box: Box) -> ImageMeta:
    """The meta of a tile's pixels: the image's dtype and range, the tile's shape."""
    shape = (box[1] - box[0], box[3] - box[2], *meta.shape[2:])
    return ImageMeta(meta.dtype, shape, meta.lo, meta.hi)
