"""visemz: GPU-first compression for scientific images and tensors."""

from .api import compress, decompress
from .codec import ImageCodec
from .errors import (
    CorruptStreamError,
    DeviceUnavailableError,
    InvalidArgumentError,
    LimitExceededError,
    UnsupportedFormatError,
    VisemzError,
)

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it (statically, without importing)

__all__ = [
    "VisemzError",
    "CorruptStreamError",
    "UnsupportedFormatError",
    "InvalidArgumentError",
    "DeviceUnavailableError",
    "LimitExceededError",
    "__version__",
    "compress",
    "decompress",
    "ImageCodec",
]
