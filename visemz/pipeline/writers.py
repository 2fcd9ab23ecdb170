"""Atomic output files: written to a temporary name, fsynced, then renamed into place.

A crash or a kill leaves either the previous complete file or none under the final
name, never a partial one; stale temporary files carry a recognisable prefix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ..errors import VisemzError

TMP_PREFIX = ".visemz-tmp-"


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
