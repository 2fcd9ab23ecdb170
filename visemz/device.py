"""Arrays across devices and libraries: torch tensors as ints streams take them and give them
back, and NumPy copies of anything (uint16 tensors included).

The device choice itself (``resolve``, ``cuda_available``) and cupy (views, streams, copies) are
``cuda.py``'s, which needs neither torch nor the encoders; this module builds on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .cuda import as_cupy, is_gpu_array
from .encoders import decode_ints

__all__ = ["as_numpy", "torch_to_ints", "ints_to_torch", "use_gpu", "published"]


def use_gpu(index: int, share: bool = False) -> int:
    """Make GPU ``index`` this process's device (torch's and cupy's); returns it.  ``share``: an index past
    the GPU count wraps around (process r on GPU r mod count), for jobs whose processes may share GPUs."""
    if share:
        index %= torch.cuda.device_count()
    torch.cuda.set_device(index)
    try:
        import cupy

        cupy.cuda.Device(index).use()
    except ImportError:
        pass
    return index


def as_numpy(x: Any) -> np.ndarray:
    """A NumPy array of a NumPy or cupy array or of a torch tensor on any device (torch cannot
    hand uint16 to NumPy itself: it goes through int32)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.dtype == torch.uint16:
            return t.to(torch.int32).cpu().numpy().astype(np.uint16)
        return t.cpu().numpy()
    if is_gpu_array(x):
        return as_cupy(x).get()
    return np.asarray(x)


def torch_to_ints(t: torch.Tensor):
    """A torch integer tensor as encode_ints takes it: flat int32, a CUDA tensor stays on the GPU."""
    t = t.to(torch.int32).contiguous().reshape(-1)
    return t if t.is_cuda else t.numpy()


def ints_to_torch(buf, device: str, **bounds) -> torch.Tensor:
    """Decode an ints stream straight into a torch int32 tensor on ``device`` (GPU decode on cuda); ``bounds``:
    ``decode_ints``' ``count`` or ``max_count``, what the reader's shape allows."""
    if device.startswith("cuda"):
        return torch.as_tensor(decode_ints(buf, device="cuda", **bounds), device=device)
    return torch.from_numpy(decode_ints(buf, **bounds))


def published(t: torch.Tensor) -> torch.Tensor:
    """``t``, made on this thread's stream for a cache that every stream reads (a layer's weights as a kernel takes
    them), once this stream has finished writing it: another stream (a pipeline lane's) reading it from the cache
    would not wait for this stream's queued work, and would read the memory before the copy lands.  One host wait
    per cached tensor; none during a CUDA graph capture, whose warm-up fills such caches first."""
    if t.is_cuda and not torch.cuda.is_current_stream_capturing():
        torch.cuda.current_stream(t.device).synchronize()
    return t
