"""Error types raised by visemz, and the order in which deferred checks report them.

Every failure a user can cause (bad input, corrupt or foreign files, a missing
GPU) is a :class:`VisemzError` subclass whose message names the bad value, so
callers can catch one base class and still tell the cases apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class VisemzError(Exception):
    """Base class of every error visemz raises on purpose."""


class CorruptStreamError(VisemzError, ValueError):
    """A compressed stream or container is truncated, altered or inconsistent."""


class UnsupportedFormatError(VisemzError, ValueError):
    """Input is valid but not something this version handles (dtype, version, field)."""


class InvalidArgumentError(VisemzError, ValueError):
    """An argument has a value outside its documented domain."""


class DeviceUnavailableError(VisemzError, RuntimeError):
    """A GPU, or a GPU-only library (cupy, nvCOMP, kvikio, DALI), is needed but absent."""


class LimitExceededError(VisemzError, ValueError):
    """An input or a stream asks for more than the documented size limits."""


class PlanMismatchError(InvalidArgumentError):
    """Ranks of a process group asked for a collective with different settings; the message names
    each setting that differs and every rank's value of it.  Raised on every rank, never a hang."""


class PeerFailedError(VisemzError, RuntimeError):
    """A collective could not finish because another rank of the group died, left or timed out."""


@contextlib.contextmanager
def checked_first_on_error(check: Callable[[], None], errors: tuple[type[BaseException], ...] = (Exception,)
                           ) -> Iterator[None]:
    """Run the block; if it raises one of ``errors``, run ``check`` first, whose own error then wins.

    For the GPU paths that defer a check to save a host read: when the block fails anyway, the deferred
    check runs before the block's error propagates, so that a call with two faults reports the same one
    on every device (the CPU path checks in that order)."""
    try:
        yield
    except errors:
        check()
        raise
