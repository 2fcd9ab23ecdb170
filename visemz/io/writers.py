"""Atomic output files: written to a temporary name, fsynced, then renamed into place.

A crash or a kill leaves either the previous complete file or none under the final
name, never a partial one; stale temporary files carry a recognisable prefix.  The file
gets the permissions ``open()`` would give it (0666 less the umask), not the private 0600
of a temporary file.
"""

from __future__ import annotations

import contextlib
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
def atomic_file(path: Path):
    """Yield (file object, temporary path) beside ``path``; on success fsync and rename to ``path``.

    Whatever fails (or is interrupted) inside, the temporary file is removed and ``path`` is
    untouched.  Other writers (kvikio) may write into the temporary path too: fsync covers
    every write to the file."""
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


def write_atomic(path: Path, data) -> None:
    with atomic_file(path) as (f, _):
        f.write(data)
