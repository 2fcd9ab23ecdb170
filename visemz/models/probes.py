"""Whether one of our fast paths runs in this process (conv64's and conv8's Triton kernels, the integer prior's 8-bit
matrix products on a CPU): each asks once, at its first use, and where it does not run the other path serves with
the same values."""

from __future__ import annotations

import importlib
import warnings


def runs(probe, what: str, instead: str, quiet: tuple = (), needs: str | None = "triton") -> bool:
    """True where the module ``needs`` (if any) is installed and ``probe()`` (a first small run checked against the
    other path) returns; else False, with one warning naming ``what`` failed and what serves ``instead`` (none for a
    missing module, or an exception in ``quiet``: warned about where it was raised)."""
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError:
            return False
    try:
        probe()
    except quiet:
        return False
    except Exception as e:  # noqa: BLE001 (whatever stops the fast path, the other path gives the same values)
        warnings.warn(f"visemz: {what} cannot run here, {instead}: {type(e).__name__}: {e}", RuntimeWarning,
                      stacklevel=3)  # the caller of the fast path's check
        return False
    return True
