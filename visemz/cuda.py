"""Is there a usable CUDA GPU, which device runs the work, and cupy views of GPU arrays.

cupy is optional: this module imports it only when asked about a GPU and answers "no GPU"
when it is missing, so the CPU install never needs it.  It sits below the encoders (which
choose the GPU path through it); ``device.py`` builds the torch-level helpers on top.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import warnings
from typing import Any

from . import defaults
from .errors import DeviceUnavailableError, InvalidArgumentError


@functools.lru_cache(maxsize=None)
def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # cupy absent, no driver, or no device: all mean "no GPU"
        return False


def require_cupy():
    if not cuda_available():
        raise DeviceUnavailableError("a CUDA GPU with cupy is required here, but none is available")
    import cupy

    return cupy


def external_stream(handle: int, device_index: int = -1):
    """A cupy stream object for a CUDA stream made elsewhere (torch's), to make current with ``with``.

    cupy 14 deprecates ExternalStream for Stream.from_external and the __cuda_stream__ protocol,
    which torch's streams do not all speak; ExternalStream still takes the raw handle and device,
    so it is used with its deprecation notice silenced here, in one place.  The wrappers are cached
    per handle and device: the collectives enter one per codec call (tens per all_reduce), and
    making one (with its warnings filter) costs more than the work it wraps.  A wrapper holds only
    the handle, and which stream is current is cupy's per-thread state, so threads share them."""
    return _external_stream(handle, device_index)


@functools.lru_cache(maxsize=256)
def _external_stream(handle: int, device_index: int):
    cupy = require_cupy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle, device_index)


class torch_stream:
    """``with torch_stream() as cp``: cupy's current device and stream are torch's current CUDA stream's (of
    device ``device_index``; by default torch's current device) for the block, so that torch, cupy and NCCL
    work stays in order.  A class rather than a generator context: a collective enters one tens of times per
    call (the host time of an exchange is Python), and this costs a few C calls."""

    __slots__ = ("_index", "_device", "_stream")

    def __init__(self, device_index: int | None = None):
        self._index = device_index

    def __enter__(self):
        cp = _cupy()
        idx, handle = _torch_current_stream(self._index)
        self._device, self._stream = cp.cuda.Device(idx), external_stream(handle, idx)
        self._device.__enter__()
        self._stream.__enter__()
        return cp

    def __exit__(self, *exc) -> bool:
        self._stream.__exit__(*exc)
        self._device.__exit__(*exc)
        return False


def after_torch(*arrays):
    """A context ordering cupy's work on ``arrays`` after the torch work that wrote them: where one is a torch
    CUDA tensor, ``torch_stream`` on its device for the block.  A tensor reaches cupy through
    ``__cuda_array_interface__``, which names no stream, so nothing else orders cupy's reads after torch's writes
    once torch works on another stream than cupy's current one (a pipeline lane's, a leftover capture stream).
    Arrays that are all cupy or NumPy change nothing."""
    tensor = next((a for a in arrays if getattr(a, "is_cuda", False)), None)  # cupy arrays have no is_cuda
    return contextlib.nullcontext() if tensor is None else torch_stream(tensor.device.index)


_CUPY = None
_TORCH = None  # (torch, its raw current-stream query or None), taken on first use: torch_stream is a hot path


def _cupy():
    global _CUPY
    if _CUPY is None:
        _CUPY = require_cupy()
    return _CUPY


def _torch_current_stream(index: int | None) -> tuple[int, int]:
    """(device index, raw handle) of torch's current CUDA stream on device ``index`` (None: torch's current
    device).  torch's raw query (what Triton calls) takes two C calls instead of torch.cuda.current_stream()'s
    Python wrapper and Stream object; a torch without it, or not yet initialised, takes the public path."""
    global _TORCH
    if _TORCH is None:
        import torch  # only reached with CUDA work at hand, where torch is imported already

        _TORCH = (torch, getattr(torch._C, "_cuda_getCurrentRawStream", None))
    torch, raw = _TORCH
    if raw is None or not torch.cuda.is_initialized():
        s = torch.cuda.current_stream(index)
        return s.device.index, s.cuda_stream
    idx = torch._C._cuda_getDevice() if index is None else index
    return idx, raw(idx)


def nvcomp_installed() -> bool:
    """Whether nvCOMP (the ``gpu`` extra's entropy coder) is installed, without importing it."""
    try:
        return importlib.util.find_spec("nvidia.nvcomp") is not None
    except ImportError:  # no ``nvidia`` package at all
        return False


def resolve(device: str | None) -> str:
    """'auto' (or None) -> 'cuda' when a GPU is usable with the ``gpu`` extra (cupy and nvCOMP), else 'cpu': a
    machine with a GPU and cupy but no nvCOMP works on the CPU rather than failing in the entropy stage."""
    device = device or defaults.get("device")
    if device == "auto":
        return "cuda" if cuda_available() and nvcomp_installed() else "cpu"
    if device not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"device={device!r}: expected 'cpu', 'cuda' or 'auto'")
    if device == "cuda":
        require_cupy()
    return device


def is_gpu_array(x: Any) -> bool:
    if hasattr(x, "__cuda_array_interface__"):
        return True
    return bool(getattr(x, "is_cuda", False))


def resident_copy(arrays, device_id: int) -> list:
    """Host arrays copied to one GPU and waited for, for caches of constant tables (copied once, not per
    image): cupy queues a copy on this thread's stream, which another stream reading the cache does not
    wait on, so the copy must be done before the cached arrays are handed out."""
    cupy = require_cupy()
    with cupy.cuda.Device(device_id):
        out = [cupy.asarray(a) for a in arrays]
        cupy.cuda.get_current_stream().synchronize()
    return out


def as_cupy(x: Any):
    """A cupy view of a cupy array or torch CUDA tensor (no copy)."""
    cp = require_cupy()
    return x if isinstance(x, cp.ndarray) else cp.asarray(x)
