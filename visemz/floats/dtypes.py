"""The float formats the float codecs take (fp32, fp16, bf16): bit layouts, NumPy views, float64 conversions."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import UnsupportedFormatError

# dtype -> (bits, exponent bits, mantissa bits, unsigned view); a stream's dtype code is the index here
FLOATS = {"float32": (32, 8, 23, np.uint32), "float16": (16, 5, 10, np.uint16), "bfloat16": (16, 8, 7, np.uint16)}
CODES = {name: i for i, name in enumerate(FLOATS)}
# the largest finite value of each format (bf16's: 0x7F7F); decoding clamps to it (``from_float64``)
FINITE_MAX = {"float32": float(np.finfo(np.float32).max), "float16": float(np.finfo(np.float16).max),
              "bfloat16": 3.3895313892515355e38}


def as_array(x) -> tuple[np.ndarray, str]:
    """NumPy view of a float tensor (torch CPU tensors and bf16 included) and its dtype name."""
    if isinstance(x, torch.Tensor):
        name = str(x.dtype).replace("torch.", "")
        if name == "bfloat16":
            return x.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16), name
        return x.detach().contiguous().cpu().numpy(), name
    a = np.asarray(x)
    if not a.dtype.isnative:  # big-endian data: the bit views below read native order
        a = a.astype(a.dtype.newbyteorder("="))
    return a, a.dtype.name


def check_float(name: str) -> None:
    """UnsupportedFormatError unless ``name`` is one of ``FLOATS``."""
    if name not in FLOATS:
        raise UnsupportedFormatError(f"dtype {name} is not one the float codecs take: {list(FLOATS)}")


def to_float64(a: np.ndarray, name: str) -> np.ndarray:
    """Values of ``name`` (bf16 as uint16 bit patterns) -> float64, exactly."""
    if name == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def from_float64(v: np.ndarray, name: str) -> np.ndarray:
    """float64 -> ``name`` by NumPy's rounding (bf16: to nearest even through float32, as uint16 bit patterns),
    clamped first to the format's finite range: a step 2 eb q beyond it (eb near the format's largest value)
    would round to inf, while its largest finite value lies as near to any finite input."""
    top = FINITE_MAX[name]
    v = np.clip(v, -top, top)
    if name != "bfloat16":
        return v.astype(name)
    bits = v.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even

