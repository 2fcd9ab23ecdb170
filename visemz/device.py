"""Where arrays live and which device runs the work.

GPU libraries are optional: this module imports cupy lazily and answers "no GPU"
when it is missing, so the CPU install never needs them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .config import DEFAULTS
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


def resolve(device: str | None) -> str:
    """'auto' (or None) -> 'cuda' when a GPU is usable, else 'cpu'."""
    device = device or DEFAULTS.device
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"device={device!r}: expected 'cpu', 'cuda' or 'auto'")
    if device == "cuda":
        require_cupy()
    return device


def is_gpu_array(x: Any) -> bool:
    if hasattr(x, "__cuda_array_interface__"):
        return True
    return bool(getattr(x, "is_cuda", False))


def as_cupy(x: Any):
    """A cupy view of a cupy array or torch CUDA tensor (no copy)."""
    cp = require_cupy()
    return x if isinstance(x, cp.ndarray) else cp.asarray(x)


def as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if is_gpu_array(x):
        return as_cupy(x).get()
    if hasattr(x, "numpy"):  # torch CPU tensor
        return x.detach().numpy()
    return np.asarray(x)


def torch_to_ints(t):
    """A torch integer tensor as encode_ints takes it: flat int32, a CUDA tensor stays on the GPU."""
    import torch

    t = t.to(torch.int32).contiguous().reshape(-1)
    return t if t.is_cuda else t.numpy()


def ints_to_torch(buf, device: str):
    """Decode an ints stream straight into a torch int32 tensor on ``device`` (GPU decode on cuda)."""
    import torch

    from .encoders import decode_ints

    if device.startswith("cuda"):
        return torch.as_tensor(decode_ints(buf, device="cuda"), device=device)
    return torch.from_numpy(decode_ints(buf))
