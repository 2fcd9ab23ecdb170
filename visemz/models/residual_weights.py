"""Residual prior weights: safetensors files beside the lossy models', loaded by variant or by id.

A file ``residual-VARIANT.safetensors`` holds the prior's parameters (float32: the network is small),
the CDF tables the residual coder codes with (``tables/...``, built once when the file is written,
never on the decoding machine: ``encoders/cdf_tables.py`` says why) and in its metadata the prior's
sizes and the lossy model whose g_s features it was trained on.  Its id (the xxh64 of the file) is
what an image file records; a file naming another id is refused, as for the lossy weights.

The integer prior's file, ``residual-int8-VARIANT.safetensors``, holds its integer layers and no tables: it
codes with the float prior's (the same family, ``residual_tables.py``), whose digest its metadata records and
loading checks, so that the two files do not ship the same 1.9 MB twice.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..encoders.cdf_tables import CdfTables
from ..errors import UnsupportedFormatError
from ..io.writers import atomic_file
from . import residual_tables
from .integer_prior import IntegerNet
from .residual_prior import ResidualPrior
from .weights import read_archived, read_tensors, read_weights, tensors_of, weights_dir, write_weights

PREFIX = "prior/"
CHANNELS = {"gray": 1, "rgb": 3}  # the image channels of each variant's prior


@dataclass(frozen=True, eq=False)
class Residual:
    """A loaded prior: its network (the float prior in float64, or the integer prior's layers: what coding runs), the
    tables, the lossy model it fits, its id."""

    prior64: ResidualPrior | None
    tables: CdfTables
    lossy_model: str
    model_id: str
    integer: IntegerNet | None = None

    @property
    def features(self) -> int:
        """The g_s features it takes."""
        return (self.integer or self.prior64).features

    @property
    def reduce(self) -> torch.nn.Module:
        """Its reduction of g_s's features (a float64 1 x 1 convolution, which the synthesis runs)."""
        return self.prior64.reduce if self.integer is None else self.integer.reduce64


def file_stem(variant: str, integer: bool = False) -> str:
    """``residual-VARIANT`` (the float prior) or ``residual-int8-VARIANT`` (the integer prior)."""
    return f"residual-int8-{variant}" if integer else f"residual-{variant}"


def path_of(variant: str, folder: Path | None = None, integer: bool = False) -> Path:
    return (folder or weights_dir()) / f"{file_stem(variant, integer)}.safetensors"


def save(prior: ResidualPrior | IntegerNet, variant: str, card: dict, folder: Path | None = None) -> str:
    """Write a prior and its card, each atomically (a file of other bytes it replaces goes into the archive beside
    it, so that the images coded with that prior still decode); returns its id.  The float prior's file holds its
    float32 parameters and the coder's tables; the integer one's its integer layers and the digest of the tables of
    the float prior already in ``folder``."""
    integer = isinstance(prior, IntegerNet)
    path = path_of(variant, folder, integer)
    state = prior.tensors() if integer else {k: v.detach().float() for k, v in prior.state_dict().items()}
    tensors = {PREFIX + k: v.cpu().contiguous() for k, v in state.items()}
    meta = {"config": json.dumps(prior.config), "lossy_model": str(card["lossy_model"]),
            "lossy_model_id": str(card["lossy_model_id"])}
    if integer:  # the float prior's tables, beside it in ``folder``
        meta["tables_digest"] = tables_digest(_read_tables(path_of(variant, folder)))
    else:
        tensors.update({residual_tables.PREFIX + k: torch.from_numpy(v)
                        for k, v in residual_tables.build().to_dict().items()})
    model_id = write_weights(path, tensors, meta)
    card = dict(card, model=file_stem(variant, integer), model_id=model_id, weights=path.name)
    with atomic_file(path.with_suffix(".json")) as (f, _):
        f.write((json.dumps(card, indent=1) + "\n").encode())
    return model_id


_LOCK = threading.Lock()
_LOADED: dict[tuple, Residual | None] = {}


def load(variant: str, device: str = "cpu", integer: bool = False, model_id: str | None = None) -> Residual | None:
    """The shipped prior of a variant (the float one, or with ``integer`` the integer one) on ``device`` (cached), or
    None where none is shipped.  ``model_id`` (the id a file names): that prior, the shipped one where it has that
    id, else the archived one (``weights.archive``), else ``UnsupportedFormatError``."""
    key = (variant, str(device), integer)
    with _LOCK, torch.inference_mode(False):
        if key not in _LOADED:
            path = path_of(variant, integer=integer)
            _LOADED[key] = _load(path, variant, device, integer) if path.is_file() else None
        installed = _LOADED[key]
        if model_id is None or (installed is not None and installed.model_id == model_id):
            return installed
        if key + (model_id,) not in _LOADED:
            _LOADED[key + (model_id,)] = _load_archived(variant, device, integer, model_id, installed)
        return _LOADED[key + (model_id,)]


def _load(path: Path, variant: str, device: str, integer: bool = False) -> Residual:
    return _built(*read_weights(path), path.name, variant, device, integer, path.parent)


def _load_archived(variant: str, device: str, integer: bool, model_id: str, installed: Residual | None) -> Residual:
    have = "none" if installed is None else installed.model_id
    data = read_archived(model_id, f"the {'integer ' if integer else ''}residual prior of {variant} images "
                                   f"(installed: {have})")
    return _built(*tensors_of(data), model_id, f"{model_id} (archived)", variant, device, integer, weights_dir())


def _built(tensors: dict, meta: dict, model_id: str, name: str, variant: str, device: str, integer: bool,
           folder: Path) -> Residual:
    """A prior of ``variant`` from its file's tensors and metadata; an integer prior takes the tables of the float
    prior of its variant in ``folder``, which must be the ones it was written with."""
    try:
        config = json.loads(meta["config"])
        if config["channels"] != CHANNELS[variant]:
            raise ValueError(f"a prior of {config['channels']} channels, not of {variant} images")
        state = {k[len(PREFIX):]: v for k, v in tensors.items() if k.startswith(PREFIX)}
        if integer:
            net, prior = IntegerNet.from_tensors(config, state), None
            tables = _read_tables(path_of(variant, folder))
            if tables_digest(tables) != meta["tables_digest"]:
                raise ValueError("the float prior beside it holds other tables than it was written with")
        else:
            net, prior = None, ResidualPrior(**config)
            prior.load_state_dict(state)
            tables = _tables_of(tensors)
    except (KeyError, TypeError, ValueError, RuntimeError, OSError) as e:
        raise UnsupportedFormatError(f"residual prior {name} is not readable: {e}") from None
    prior64 = None if integer else prior.double().eval().requires_grad_(False).to(device)
    return Residual(prior64, tables, meta.get("lossy_model", ""), model_id, None if net is None else net.to(device))


def _tables_of(tensors: dict) -> CdfTables:
    return CdfTables.from_dict({k[len(residual_tables.PREFIX):]: v.numpy() for k, v in tensors.items()
                                if k.startswith(residual_tables.PREFIX)})


def _read_tables(path: Path) -> CdfTables:
    """The tables of a float prior's file."""
    return _tables_of(read_tensors(path)[0])


def tables_digest(tables: CdfTables) -> str:
    """sha256 of the tables' arrays (int32, in their fixed order)."""
    h = hashlib.sha256()
    for _, v in sorted(tables.to_dict().items()):
        h.update(v.tobytes())
    return h.hexdigest()


def _cache_clear() -> None:
    with _LOCK:
        _LOADED.clear()


load.cache_clear = _cache_clear  # type: ignore[attr-defined]
