"""The tile index of an image file of format 4 or 5 (docs/FORMAT.md, section 4.3): where each tile's parts lie.

Every tile holds the same named parts (its symbol sections, and with ``max_error`` its residual
sections), coded as in format 3 but per tile.  The container's section ``tiles`` holds them back
to back, tile by tile in row-major order, parts in the order the header's ``tiles.parts`` lists;
the section ``tile_index`` holds, per tile, each part's length (u64 in format 4, a LEB128 varint in
format 5), then per tile the coding of each symbol section (u8: 0 rANS, 1 ints stream), so a reader
finds one tile's bytes without touching the others'.
"""

from __future__ import annotations

import numpy as np

from ..errors import CorruptStreamError
from ..framing import read_varints, write_varints
from .latents import CODINGS

INDEX, TILES = "tile_index", "tiles"
VARINT_FORMAT = 5  # the image format from which the part lengths are varints (format 4: u64)


def pack(parts: list[str], symbols: list[str], tiles: list[tuple[dict, dict]], fmt: int) -> dict[str, bytes]:
    """Per tile (its parts by name, its coding by symbol section) -> the sections ``tile_index`` and ``tiles``
    of image format ``fmt``."""
    lengths = np.array([[len(p[name]) for name in parts] for p, _ in tiles], dtype="<u8")
    codes = np.array([[CODINGS.index(c[name]) for name in symbols] for _, c in tiles], dtype=np.uint8)
    body = b"".join(bytes(p[name]) for p, _ in tiles for name in parts)
    stored = write_varints(lengths) if fmt >= VARINT_FORMAT else lengths.tobytes()
    return {INDEX: stored + codes.tobytes(), TILES: body}


class TileIndex:
    """A parsed, checked tile index: ``part(i, name)`` is a view of tile i's bytes of that part."""

    def __init__(self, sections: dict, count: int, parts: list[str], symbols: list[str], fmt: int):
        index, self.body = sections[INDEX], sections[TILES]
        n, p, s = count, len(parts), len(symbols)
        if fmt >= VARINT_FORMAT:
            lengths, pos = read_varints(index, 0, n * p, "tile index lengths")
        else:
            pos = 8 * n * p
            lengths = np.frombuffer(index, dtype="<u8", count=n * p) if len(index) >= pos else None
        if lengths is None or len(index) != pos + n * s:
            raise CorruptStreamError(f"tile index holds {len(index)} bytes for {n} tiles of {p} parts "
                                     f"and {s} symbol sections ({'varints and ' if fmt >= VARINT_FORMAT else ''}"
                                     f"{n * s} coding bytes expected)")
        # each length at most the body, so that their sum cannot wrap around
        if (lengths > len(self.body)).any() or int(lengths.sum()) != len(self.body):
            raise CorruptStreamError(f"tile index lengths {lengths[:4].tolist()}... do not split the "
                                     f"{len(self.body)}-byte tiles section")
        codes = np.frombuffer(index, dtype=np.uint8, offset=pos).reshape(n, s)
        if (codes >= len(CODINGS)).any():
            raise CorruptStreamError(f"tile index codings {np.unique(codes).tolist()} are not all in "
                                     f"0..{len(CODINGS) - 1}")
        ends = np.cumsum(lengths).reshape(n, p)
        self.ends, self.lengths, self.codes = ends, lengths.reshape(n, p), codes
        self.parts, self.symbols = parts, symbols

    def part(self, i: int, name: str) -> memoryview:
        k = self.parts.index(name)
        end = int(self.ends[i, k])
        return self.body[end - int(self.lengths[i, k]):end]

    def sections(self, i: int) -> dict[str, memoryview]:
        return {name: self.part(i, name) for name in self.parts}

    def coding(self, i: int) -> dict[str, str]:
        return {name: CODINGS[int(c)] for name, c in zip(self.symbols, self.codes[i])}
