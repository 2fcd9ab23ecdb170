"""visemz: GPU-first compression for scientific images and tensors."""

from .errors import (
    CorruptStreamError,
    DeviceUnavailableError,
    InvalidArgumentError,
    LimitExceededError,
    UnsupportedFormatError,
    VisemzError,
)

__version__ = "0.1.0"

__all__ = [
    "VisemzError",
    "CorruptStreamError",
    "UnsupportedFormatError",
    "InvalidArgumentError",
    "DeviceUnavailableError",
    "LimitExceededError",
    "__version__",
]
