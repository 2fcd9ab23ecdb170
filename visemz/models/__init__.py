"""Learned transforms: CompressAI architectures with gain units, a registry of named models, weights."""

from .registry import ARCHITECTURES, VARIANTS, ModelSpec, all_specs, parse, spec

__all__ = ["ARCHITECTURES", "VARIANTS", "ModelSpec", "all_specs", "parse", "spec", "load", "available"]


def __getattr__(name: str):
    """``load`` and ``available`` come from ``weights`` (torch) on first use, so the registry alone stays light."""
    if name in ("load", "available"):
        from . import weights

        return getattr(weights, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
