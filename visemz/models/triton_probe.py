"""Whether one of our Triton kernels runs in this process (conv64's, conv8's): each asks once, at its first use."""

from __future__ import annotations

import warnings


def runs(probe, what: str, instead: str, quiet: tuple = ()) -> bool:
    """True where Triton is installed and ``probe()`` (a first small launch checked against the other path) returns;
    else False, with one warning naming ``what`` failed and what serves ``instead`` (none for an exception in
    ``quiet``: warned about where it was raised)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    try:
        probe()
    except quiet:
        return False
    except Exception as e:  # noqa: BLE001 (whatever stops the kernel, the other path gives the same values)
        warnings.warn(f"visemz: {what} cannot run here, {instead}: {type(e).__name__}: {e}", RuntimeWarning,
                      stacklevel=3)  # the caller of the kernel module's available()
        return False
    return True
