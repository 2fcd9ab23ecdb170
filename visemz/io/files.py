"""Which files a folder job handles, where their outputs go, and which rank takes which.

Inputs are found by walking the source tree in sorted order (deterministic, so every
rank of a multi-GPU run sees the same list); outputs mirror the tree:
``SRC/a/b/c.tif`` becomes ``DST/a/b/c.tif.vsz``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgumentError

SUFFIX = ".vsz"
IMAGE_EXTENSIONS = {".png", ".tif", ".tiff", ".jpg", ".jpeg", ".jp2", ".bmp", ".pgm", ".ppm", ".npy", ".dcm"}


@dataclass(frozen=True)
class Item:
    src: Path
    dst: Path
    rel: str  # path relative to the source root, '/'-separated


def discover(src: Path, extensions: set[str] | None = None, suffix: str = "") -> list[Path]:
    """Files under ``src`` (or ``src`` itself), sorted; hidden files and folders are skipped."""
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise InvalidArgumentError(f"source {str(src)!r} is neither a file nor a folder")
    found = []
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            p = Path(root) / f
            if f.startswith(".") or (suffix and not f.endswith(suffix)):
                continue
            if extensions is None or p.suffix.lower() in extensions:
                found.append(p)
    return found


def plan(src: Path, dst: Path, files: list[Path], to_name) -> list[Item]:
    """Pair each input with its output path; refuses outputs that would land on an input."""
    src, dst = src.resolve(), dst.resolve()
    items = []
    for f in files:
        f = f.resolve()
        rel = f.name if src.is_file() else f.relative_to(src).as_posix()
        out = dst / to_name(rel)
        if out == f:
            raise InvalidArgumentError(f"output {str(out)!r} would overwrite its input")
        items.append(Item(f, out, rel))
    return items


def compressed_name(rel: str) -> str:
    return rel + SUFFIX


def shard(items: list, rank: int, world: int) -> list:
    """Rank r of w takes items r, r + w, ... (the list is the same on every rank)."""
    if not (0 <= rank < world):
        raise InvalidArgumentError(f"rank {rank} is outside a world of {world}")
    return items[rank::world]
