"""Learned transforms: CompressAI architectures with gain units, a registry of named models, weights."""

from .registry import ARCHITECTURES, VARIANTS, ModelSpec, all_specs, parse, spec
from .weights import available, load

__all__ = ["ARCHITECTURES", "VARIANTS", "ModelSpec", "all_specs", "parse", "spec", "load", "available"]
