"""The settings in force: one set for the process, read from the VISEMZ_* environment variables when
visemz first needs one, then changed by a program for good or for one block.

    import visemz

    visemz.defaults.get("zstd_level")                  # the value in force
    visemz.defaults.set(zstd_level=9)                  # from here on
    with visemz.defaults.set(entropy_chunk=1 << 16):   # within the block; the earlier value after it
        ...

Every module reads a setting when it needs it, through ``get`` (or ``current`` for several that must
agree), never a copy taken at import: a change applies to the next call that reads it, in every thread.
The settings, their defaults and rules are the table in ``config.py`` (docs/settings.md).
"""

from __future__ import annotations

import dataclasses
import os
import threading

from . import config
from .errors import InvalidArgumentError

_LOCK = threading.Lock()  # one change at a time: each builds on the values the one before left
# read from the environment on first use (a bad VISEMZ_* value is then an InvalidArgumentError of that use, which
# the command line reports as a usage error, not a failure to import), then replaced whole on each change, so a
# reader never sees half of one
_current: config.Defaults | None = None


def current() -> config.Defaults:
    """Every setting in force, as one frozen snapshot."""
    return _current if _current is not None else _from_env()


def get(name: str):
    """The value in force of setting ``name``."""
    return getattr(current(), _known(name))


def set(**values) -> _Restore:  # kvikio.defaults.set's name; this module needs no builtin set
    """Give settings new values now.  As a context manager (``with set(...):``) it gives the settings it
    changed their earlier values back when the block ends, however it ends.  Every value is checked first,
    by the rules of its environment variable: a bad name or value raises InvalidArgumentError naming it, and
    nothing changes."""
    checked = {name: _checked(name, value) for name, value in values.items()}
    return _Restore(_replace(checked))


class _Restore:
    """What a ``set`` call changed, to give it back at the end of a ``with`` block."""

    def __init__(self, before: dict):
        self._before = before

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        _replace(self._before)


def cpu_threads() -> int:
    """CPU threads for zstd and loaders: the ``threads`` setting, or every core when it is 0."""
    return get("threads") or (os.cpu_count() or 1)


def _known(name: str) -> str:
    if name not in config.ENV:
        raise InvalidArgumentError(f"unknown setting {name!r}: expected one of {', '.join(config.ENV)}")
    return name


def _checked(name: str, value):
    value = config.check(_known(name), value)
    if name == "tile":  # the tile rule is tiling's (config.RULES says why); importing it here loads torch
        from .image.tiling import check_tile

        check_tile(value)
    return value


def _from_env() -> config.Defaults:
    global _current
    with _LOCK:
        if _current is None:
            _current = config.from_env()
        return _current


def _replace(values: dict) -> dict:
    """Put ``values`` in force; the values they replace."""
    global _current
    current()  # the environment's values first (reading them takes the lock)
    with _LOCK:
        before = {name: getattr(_current, name) for name in values}
        _current = dataclasses.replace(_current, **values)
    return before
