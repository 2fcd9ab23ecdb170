"""The integer CDF tables a model's latents are coded with, computed once from the model and shipped in its weights.

    tables = compute(model)                 # on the CPU, in float64 (weight-export time only)
    tensors = to_tensors(tables)            # int32 / float64 tensors named tables/...
    tables = from_tensors(tensors)          # when the weights are loaded: never recomputed

factorized: one table per channel of the EntropyBottleneck (the factorized model's y, the
hyperprior model's z), what CompressAI's ``EntropyBottleneck.update()`` derives: per channel,
the likelihood at ``median - minima .. median + maxima`` and the tail mass outside as the escape.
gaussian / scale_table (mean-scale models only): CompressAI's GaussianConditional tables, one
per scale of its default 64-scale table, and that table in float64 (``scale_indexes`` maps a
predicted scale to a table with it).

The float -> int step runs in float64 and its last bits may differ between machines (libm,
scipy), so tables are computed when the weights are written and decoders read them from the
file: the integers both sides code with are then the same by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from compressai.entropy_models import EntropyBottleneck

from ..encoders.cdf_tables import CdfTables, default_scale_table, from_pmfs, gaussian_scale_tables
from ..errors import UnsupportedFormatError

PREFIX = "tables/"
FACTORIZED, GAUSSIAN, SCALE_TABLE = PREFIX + "factorized/", PREFIX + "gaussian/", PREFIX + "scale_table"


@dataclass(frozen=True, eq=False)
class ModelTables:
    factorized: CdfTables
    gaussian: CdfTables | None = None
    scale_table: np.ndarray | None = None  # float64, strictly increasing (gaussian's scales)


def compute(model: torch.nn.Module) -> ModelTables:
    """The model's tables, on the CPU in float64 (the model itself is not changed)."""
    factorized = bottleneck_tables(model.entropy_bottleneck)
    if not hasattr(model, "gaussian_conditional"):
        return ModelTables(factorized)
    scales = default_scale_table()
    return ModelTables(factorized, gaussian_scale_tables(scales), scales)


@torch.no_grad()
def bottleneck_tables(bottleneck) -> CdfTables:
    """Per-channel tables of a CompressAI EntropyBottleneck: its update()'s pmf and tail logic, in float64.

    Symbol value v of channel c stands for v + median_c, the codec's (and CompressAI's)
    ``round(y - median)``; the table covers v in -minima_c .. maxima_c."""
    eb = _float64_cpu_copy(bottleneck)
    q = eb.quantiles.detach()
    medians = q[:, 0, 1]
    minima = torch.clamp(torch.ceil(medians - q[:, 0, 0]), min=0).long()
    maxima = torch.clamp(torch.ceil(q[:, 0, 2] - medians), min=0).long()
    channels = medians.numel()
    width = int((minima + maxima).max()) + 1
    # every channel's samples in one call: row c holds median_c - minima_c + 0..width-1
    samples = medians[:, None] - minima[:, None] + torch.arange(width, dtype=torch.float64)[None, :]
    pmf, lower, upper = eb._likelihood(samples[:, None, :], stop_gradient=True)
    pmfs, tails = [], []
    for c in range(channels):
        n = int(minima[c] + maxima[c]) + 1
        pmfs.append(pmf[c, 0, :n].numpy())
        tails.append(float(torch.sigmoid(lower[c, 0, 0]) + torch.sigmoid(-upper[c, 0, n - 1])))
    return from_pmfs(pmfs, tails, (-minima).numpy())


def _float64_cpu_copy(bottleneck):
    """A float64 CPU EntropyBottleneck with the same parameters (the model stays as it is)."""
    eb = EntropyBottleneck(bottleneck.channels, tail_mass=bottleneck.tail_mass,
                           init_scale=bottleneck.init_scale, filters=bottleneck.filters)
    params = {k: v for k, v in bottleneck.state_dict().items() if not k.startswith("_")}
    eb.load_state_dict(params, strict=False)
    return eb.double().eval()


def to_tensors(tables: ModelTables) -> dict[str, torch.Tensor]:
    """The tables as safetensors-ready tensors: CDF arrays int32, the scale table float64."""
    out = {k: torch.from_numpy(v) for k, v in tables.factorized.to_dict(FACTORIZED).items()}
    if tables.gaussian is not None:
        out.update({k: torch.from_numpy(v) for k, v in tables.gaussian.to_dict(GAUSSIAN).items()})
        out[SCALE_TABLE] = torch.from_numpy(np.asarray(tables.scale_table, np.float64).copy())
    return out


def from_tensors(tensors: dict[str, torch.Tensor], hyperprior: bool, name: str) -> ModelTables | None:
    """The tables of a weights file (its tables/ tensors); None for a file without any (it can
    still decode image format 2), UnsupportedFormatError for an incomplete set."""
    arrays = {k: v.numpy() for k, v in tensors.items() if k.startswith(PREFIX)}
    if not arrays:
        return None
    need = [FACTORIZED + "cdf"] + ([GAUSSIAN + "cdf", SCALE_TABLE] if hyperprior else [])
    if any(k not in arrays for k in need):
        raise UnsupportedFormatError(f"weights {name} hold an incomplete set of entropy coding tables "
                                     f"(need {need}): re-write them with tools/export_weights.py --add-tables")
    factorized = CdfTables.from_dict(arrays, FACTORIZED)
    if not hyperprior:
        return ModelTables(factorized)
    scales = np.asarray(arrays[SCALE_TABLE], np.float64)
    gaussian = CdfTables.from_dict(arrays, GAUSSIAN)
    if scales.ndim != 1 or scales.size != gaussian.n_tables:
        raise UnsupportedFormatError(f"weights {name}: {scales.size} scales for {gaussian.n_tables} Gaussian tables")
    return ModelTables(factorized, gaussian, scales)
