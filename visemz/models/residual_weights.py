"""Residual prior weights: safetensors files beside the lossy models', loaded by variant or by id.

A file ``residual-VARIANT.safetensors`` holds the prior's parameters (float32: the network is small),
the CDF tables the residual coder codes with (``tables/...``, built once when the file is written,
never on the decoding machine: ``encoders/cdf_tables.py`` says why) and in its metadata the prior's
sizes and the lossy model whose g_s features it was trained on.  Its id (the xxh64 of the file) is
what an image file records; a file naming another id is refused, as for the lossy weights.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..encoders.cdf_tables import CdfTables
from ..errors import UnsupportedFormatError
from ..io.writers import atomic_file
from . import residual_tables
from .residual_prior import ResidualPrior
from .weights import file_id, read_tensors, weights_dir

PREFIX = "prior/"


@dataclass(frozen=True, eq=False)
class Residual:
    """A loaded prior: its float64 network (what coding runs), the tables, the lossy model it fits, its id."""

    prior64: ResidualPrior
    tables: CdfTables
    lossy_model: str
    model_id: str


def path_of(variant: str, folder: Path | None = None) -> Path:
    return (folder or weights_dir()) / f"residual-{variant}.safetensors"


def save(prior: ResidualPrior, variant: str, card: dict, folder: Path | None = None) -> str:
    """Write a prior (float32 parameters and the coder's tables) and its card, each atomically; returns its id."""
    path = path_of(variant, folder)
    tensors = {PREFIX + k: v.detach().float().cpu().contiguous() for k, v in prior.state_dict().items()}
    tables = residual_tables.build()
    tensors.update({residual_tables.PREFIX + k: torch.from_numpy(v) for k, v in tables.to_dict().items()})
    meta = {"config": json.dumps(prior.config), "lossy_model": str(card["lossy_model"]),
            "lossy_model_id": str(card["lossy_model_id"])}
    with atomic_file(path) as (_, tmp):
        save_file(tensors, str(tmp), metadata=meta)
    model_id = file_id(path)
    card = dict(card, model=f"residual-{variant}", model_id=model_id, weights=path.name)
    with atomic_file(path.with_suffix(".json")) as (f, _):
        f.write((json.dumps(card, indent=1) + "\n").encode())
    return model_id


_LOCK = threading.Lock()
_LOADED: dict[tuple, Residual | None] = {}


def load(variant: str, device: str = "cpu") -> Residual | None:
    """The shipped prior of a variant on ``device`` (cached), or None where none is shipped."""
    key = (variant, str(device))
    with _LOCK, torch.inference_mode(False):
        if key not in _LOADED:
            path = path_of(variant)
            _LOADED[key] = _load(path, device) if path.is_file() else None
        return _LOADED[key]


def _load(path: Path, device: str) -> Residual:
    tensors, meta = read_tensors(path)
    try:
        config = json.loads(meta["config"])
        prior = ResidualPrior(**config)
        prior.load_state_dict({k[len(PREFIX):]: v for k, v in tensors.items() if k.startswith(PREFIX)})
        tables = CdfTables.from_dict({k[len(residual_tables.PREFIX):]: v.numpy() for k, v in tensors.items()
                                      if k.startswith(residual_tables.PREFIX)})
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise UnsupportedFormatError(f"residual prior {path.name} is not readable: {e}") from None
    prior64 = prior.double().eval().requires_grad_(False).to(device)
    return Residual(prior64, tables, meta.get("lossy_model", ""), file_id(path))


def _cache_clear() -> None:
    with _LOCK:
        _LOADED.clear()


load.cache_clear = _cache_clear  # type: ignore[attr-defined]
