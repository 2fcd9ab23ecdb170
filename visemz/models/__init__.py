"""Learned transforms: CompressAI architectures with gain units, a registry of named models, weights."""

from .registry import ARCHITECTURES, VARIANTS, ModelSpec, all_specs, parse, spec

__all__ = ["ARCHITECTURES", "VARIANTS", "ModelSpec", "all_specs", "parse", "spec", "load", "available"]


def __getattr__(name):
    # weights import torch and compressai: load them on first use, so that the registry stays light
    if name in ("load", "available"):
        from . import weights

        return getattr(weights, name)
    raise AttributeError(f"module 'visemz.models' has no attribute {name!r}")
