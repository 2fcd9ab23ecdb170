"""Atomic output files: written to a temporary name, fsynced, then renamed into place.

A crash or a kill leaves either the previous complete file or none under the final
name, never a partial one; stale temporary files carry a recognisable prefix.  The file
gets the permissions ``open()`` would give it (0666 less the umask), not the private 0600
of a temporary file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
from pathlib import Path

from ..errors import VisemzError

TMP_PREFIX = ".visemz-tmp-"
# read once, at import: setting the umask to read it is process-wide, so not done while threads write
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK


class OutputError(VisemzError, OSError):
    """An output could not be written (permissions, full disk, ...)."""


@contextlib.contextmanager
def atomic_file(path: Path, before_replace=None):
    """Yield (file object, temporary path) beside ``path``; on success fsync and rename to ``path``.

    Whatever fails (or is interrupted) inside, the temporary file is removed and ``path`` is
    untouched.  Other writers (kvikio) may write into the temporary path too: fsync covers
    every write to the file.  ``before_replace(file object)`` runs after the fsync and before the
    rename (a job records the output it is about to place, so a kill never leaves an unrecorded
    file under a final name)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    except OSError as e:
        raise OutputError(f"cannot write into {str(path.parent)!r}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "r+b") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            yield f, Path(tmp)
            f.flush()
            os.fsync(f.fileno())
            if before_replace is not None:
                before_replace(f)
            if os.stat(tmp).st_ino != os.fstat(f.fileno()).st_ino:
                _settle(Path(tmp))
        os.replace(tmp, path)
    except OutputError:
        Path(tmp).unlink(missing_ok=True)
        raise
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"cannot write {str(path)!r}: {e.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _settle(tmp: Path) -> None:
    """A writer given the temporary path put a new file there (safetensors' ``save_file`` does): give that one
    the permissions and the fsync the file object's had."""
    os.chmod(tmp, FILE_MODE)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data, before_replace=None) -> None:
    with atomic_file(path, before_replace) as (f, _):
        f.write(data)


def stale_temporaries(folder: Path) -> list[Path]:
    """Temporary files an interrupted writer left under ``folder`` (they carry ``TMP_PREFIX``)."""
    found = []
    for root, _dirs, files in os.walk(folder):
        found += [Path(root) / f for f in files if f.startswith(TMP_PREFIX)]
    return sorted(found)


def finite(value):
    """``value`` with every non-finite float replaced by a string ("inf", "-inf", "nan"): what JSON
    can carry (json.dumps would write Infinity, which no JSON parser reads)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def to_json(value, indent: int | None = 1) -> str:
    """Strict JSON text of ``value`` (non-finite floats as strings, see ``finite``)."""
    return json.dumps(finite(value), indent=indent, allow_nan=False)


class FolderLock:
    """An exclusive lock on a folder a job writes into (``flock`` on a hidden file in it), so two
    jobs never write into one destination at once; released when the job ends or dies."""

    NAME = ".visemz-lock"

    def __init__(self, folder: Path):
        self.path = folder / self.NAME
        self._fd: int | None = None

    def __enter__(self):
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        except OSError as e:
            raise OutputError(f"cannot write into {str(self.path.parent)!r}: {e.strerror}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            self._fd = None
            raise OutputError(f"another visemz job is writing into {str(self.path.parent)!r}; "
                              "wait for it to end, or choose another destination") from None
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            os.close(self._fd)  # releases the lock; the file stays (removing it would race a waiting job)
            self._fd = None
        return False
