"""Which files a folder job handles, where their outputs go, and which rank takes which.

Inputs are found by walking the source tree in sorted order (deterministic, so every
rank of a multi-GPU run sees the same list); outputs mirror the tree:
``SRC/a/b/c.tif`` becomes ``DST/a/b/c.tif.vsz``.

Inputs are only ever read.  A destination that is, contains or lies inside its source (or the
other way round, links resolved) is refused before any work (``check_apart``).  A file the job
cannot read safely, a link out of the source tree or in a loop, a link to a device or a pipe,
is still an item: it carries the reason (``Item.problem``) and the job reports it as failed.

File names are kept as the operating system gives them (a name that is not UTF-8 arrives with
surrogate escapes, which every path call accepts); ``shown`` makes any name printable.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ..errors import InvalidArgumentError

SUFFIX = ".vsz"
IMAGE_EXTENSIONS = {".png", ".tif", ".tiff", ".jpg", ".jpeg", ".jp2", ".bmp", ".pgm", ".ppm", ".npy", ".dcm"}
HASH_CHUNK = 1 << 22  # bytes read at a time when hashing a file
# what a job reads: (extensions, name suffix, what they are called), as discover and check_source take them
IMAGES = (IMAGE_EXTENSIONS, "", "images")
VSZ_FILES = (None, SUFFIX, ".vsz files")


@dataclass(frozen=True)
class Item:
    src: Path  # the file to read (a link inside the tree: its target)
    dst: Path
    rel: str  # path relative to the source root, '/'-separated
    problem: str = ""  # why this file cannot be read safely; "" when it can


def shown(name) -> str:
    """A file name as text that can be printed and stored in JSON: bytes that are not UTF-8
    (surrogate escapes in a str) become ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def check_apart(src: Path, dst: Path) -> None:
    """Refuse a destination that is, contains or lies inside the source, or the other way round.

    Links are resolved first, so no path spelling can make a job write into its own input."""
    s, d = src.resolve(), dst.resolve()
    if s == d:
        why = "is the source"
    elif d.is_relative_to(s):
        why = "lies inside the source"
    elif s.is_relative_to(d):
        why = "contains the source"
    else:
        return
    raise InvalidArgumentError(f"destination '{shown(dst)}' {why} '{shown(src)}'"
                               + (f" (it resolves to '{shown(d)}')" if d != dst.absolute() else "")
                               + ": inputs are never written over; choose a folder outside the source")


def discover(src: Path, extensions: set[str] | None = None, suffix: str = "") -> list[Path]:
    """Files under ``src`` (or ``src`` itself), sorted; hidden files and folders are skipped.

    Links are listed as found (links to folders too, which are not followed); ``plan`` judges them."""
    return list(_walk(src, extensions, suffix))


def check_source(src: Path, dst: Path, extensions: set[str] | None, suffix: str, what: str) -> None:
    """Refuse, before any work, a job whose source and destination overlap (``check_apart``) or
    whose source holds nothing to do (it stops at the first input it finds)."""
    check_apart(src, dst)
    if next(_walk(src, extensions, suffix), None) is None:
        raise InvalidArgumentError(f"no {what} in '{shown(src)}': nothing to do")


def _walk(src: Path, extensions: set[str] | None, suffix: str):
    if src.is_file():
        yield src
        return
    if not src.is_dir():
        raise InvalidArgumentError(f"source '{shown(src)}' is neither a file nor a folder")
    for root, dirs, files in os.walk(src):
        linked = [d for d in dirs if os.path.islink(os.path.join(root, d))]  # os.walk does not enter them
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in linked)
        for f in sorted(files + linked):
            p = Path(root) / f
            if f.startswith(".") or (suffix and not f.endswith(suffix)):
                continue
            if extensions is None or suffix or p.suffix.lower() in extensions or f in linked:
                yield p


def plan(src: Path, dst: Path, files: list[Path], to_name) -> list[Item]:
    """Pair each input with its output path (``dst / to_name(rel)``), with the reason it cannot be
    read when it cannot."""
    root = src.resolve() if src.is_dir() else src.resolve().parent
    dst = dst.absolute()
    items = []
    for f in files:
        rel = f.name if not src.is_dir() else f.relative_to(src).as_posix()
        target, problem = _target(f, root)
        items.append(Item(target, dst / to_name(rel), rel, problem))
    return items


def _target(f: Path, root: Path) -> tuple[Path, str]:
    """(the file to read, "") or (the path, why it is refused)."""
    try:
        target = f.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a loop so
        return f, "is a symbolic link in a loop"
    except OSError as e:
        if os.path.islink(f):
            return f, "is a symbolic link in a loop" if e.errno == 40 else "is a symbolic link to nothing"
        return f, f"cannot be read: {e.strerror}"
    if f.is_symlink() and not target.is_relative_to(root):
        return f, f"is a symbolic link to '{shown(target)}', outside the source folder"
    try:
        mode = target.stat().st_mode
    except OSError as e:
        return f, f"cannot be read: {e.strerror}"
    if stat.S_ISDIR(mode):
        return f, "is a link to a folder; links to folders are not followed"
    if not stat.S_ISREG(mode):
        return f, "is not a regular file (a device, a pipe or a socket)"
    return target, ""


def compressed_name(rel: str) -> str:
    return rel + SUFFIX


def shard(items: list, rank: int, world: int) -> list:
    """Rank r of w takes items r, r + w, ... (the list is the same on every rank)."""
    if not (0 <= rank < world):
        raise InvalidArgumentError(f"rank {rank} is outside a world of {world}")
    return items[rank::world]


# ---------------------------------------------------------------------- file identity
@dataclass(frozen=True)
class Identity:
    """What a file was when a job read or wrote it: size, modification time and a content hash.

    ``seen_ns`` is when it was looked at: a file modified in the same moment (within ``RACY_NS``:
    file systems store times coarser than nanoseconds) may change again without its time
    changing, so its size and time alone do not prove it unchanged (as git treats "racily clean"
    files); its hash does."""

    size: int
    mtime_ns: int
    xxh64: str
    seen_ns: int

    RACY_NS = 2_000_000_000

    def to_dict(self) -> dict:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "xxh64": self.xxh64, "seen_ns": self.seen_ns}

    @classmethod
    def from_dict(cls, d) -> "Identity | None":
        try:
            return cls(int(d["size"]), int(d["mtime_ns"]), str(d["xxh64"]), int(d["seen_ns"]))
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def of_bytes(cls, data, st: os.stat_result) -> "Identity":
        """The identity of a file read whole into ``data``, with ``st`` its fstat."""
        return cls(st.st_size, st.st_mtime_ns, xxhash.xxh64(data).hexdigest(), time.time_ns())

    def matches(self, path: Path) -> bool:
        """Whether ``path`` still holds what this identity describes: size and time when they
        settle it, else the content hash."""
        try:
            st = path.stat()
        except OSError:
            return False
        if st.st_size != self.size or not stat.S_ISREG(st.st_mode):
            return False
        if st.st_mtime_ns == self.mtime_ns and self.mtime_ns < self.seen_ns - self.RACY_NS:
            return True
        return identify(path).xxh64 == self.xxh64


def identify(source) -> Identity:
    """The identity of a file, hashed in chunks (its content is not kept): ``source`` is a path, or
    a file open for reading (read from its start with ``pread``: its position is left alone)."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return identify(f)
    fd = source.fileno()
    st = os.fstat(fd)
    h, offset = xxhash.xxh64(), 0
    while chunk := os.pread(fd, HASH_CHUNK, offset):
        h.update(chunk)
        offset += len(chunk)
    return Identity(offset, st.st_mtime_ns, h.hexdigest(), time.time_ns())
