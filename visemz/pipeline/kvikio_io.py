"""kvikio: file bytes straight into GPU memory, and GPU arrays straight into files.

kvikio uses GPUDirect Storage (cuFile) where the system supports it and its own POSIX
"compat mode" (a pinned bounce buffer) elsewhere; ``mode()`` says which.  Reads take a
``probe.RawLayout`` (the header was parsed on the host); writes produce .npy files whose
bytes equal ``numpy.save``'s, atomically (``writers.atomic_file``).

kvikio is optional (the ``[gpu]`` extra) and imported only when used.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
import torch

from ..errors import DeviceUnavailableError
from ..io.loaders import InputError
from ..io.writers import OutputError, atomic_file
from .probe import RawLayout


@functools.lru_cache(maxsize=None)
def available() -> bool:
    try:
        import kvikio  # noqa: F401
    except Exception:  # absent, or present without a usable CUDA driver
        return False
    return True


def require():
    if not available():
        raise DeviceUnavailableError("kvikio is not installed: pip install 'visemz[gpu]' (kvikio-cu13)")
    import kvikio

    return kvikio


def mode() -> str:
    """'gds' when kvikio talks to cuFile (GPUDirect Storage), 'compat' when it uses POSIX I/O."""
    require()
    import kvikio.defaults  # a submodule that ``import kvikio`` does not load

    return "compat" if kvikio.defaults.is_compat_mode_preferred() else "gds"


def read(path: Path, layout: RawLayout, device_index: int):
    """The pixels at ``layout`` as a CUDA tensor (uint8 bytes read, then viewed as the dtype)."""
    kvikio = require()
    buf = torch.empty(layout.nbytes, dtype=torch.uint8, device=f"cuda:{device_index}")
    try:
        with kvikio.CuFile(str(path), "r") as f:
            got = f.read(buf, layout.nbytes, layout.offset)  # blocking: the bytes are in place on return
    except Exception as e:  # kvikio raises RuntimeError, OSError, ...; the caller hands the file to the CPU loader
        raise InputError(f"kvikio cannot read {str(path)!r}: {type(e).__name__}: {e}") from None
    if got != layout.nbytes:
        raise InputError(f"kvikio read {got} of {layout.nbytes} bytes from {str(path)!r}")
    return buf.view(getattr(torch, layout.dtype)).reshape(layout.shape)


def npy_header(shape: tuple[int, ...], dtype) -> bytes:
    """The .npy header numpy.save writes for a C-order array of ``shape`` and ``dtype``."""
    fmt = np.lib.format
    buf = io.BytesIO()
    fmt.write_array_header_1_0(buf, {"descr": fmt.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                                     "shape": tuple(int(s) for s in shape)})
    return buf.getvalue()


def write_npy(path: Path, tensor, before_replace=None) -> int:
    """Write a CUDA tensor as a .npy file, the payload straight from GPU memory; returns its size.

    The tensor's producing stream must be finished (the executor's lanes finish before their
    outputs move on).  ``before_replace``: as ``writers.atomic_file``'s."""
    kvikio = require()
    dtype = str(tensor.dtype).replace("torch.", "")
    header = npy_header(tuple(tensor.shape), dtype)
    payload = tensor.contiguous().reshape(-1).view(torch.uint8)
    torch.cuda.current_stream(tensor.device).synchronize()  # kvikio reads the memory outside torch's streams
    with atomic_file(path, before_replace) as (f, tmp):
        f.write(header)
        f.flush()
        try:
            with kvikio.CuFile(str(tmp), "r+") as g:
                put = g.write(payload, payload.numel(), len(header))
        except (RuntimeError, ValueError) as e:
            raise OutputError(f"kvikio cannot write {str(path)!r}: {e}") from None
        if put != payload.numel():
            raise OutputError(f"kvikio wrote {put} of {payload.numel()} bytes to {str(path)!r}")
    return len(header) + payload.numel()
