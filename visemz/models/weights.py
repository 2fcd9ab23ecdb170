"""Model weights as safetensors: int8 convolution kernels, everything else float32 (gains included).

Convolution kernels (the bulk of every model) are stored as int8 with one float32
scale per output channel; other parameters and buffers (a few KB) as float32.  Loading goes
through ``safetensors`` only: nothing is ever unpickled.  The model id recorded in
every compressed file is the xxh64 of the weights file, so a file written with other
weights is refused instead of decoded into garbage.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from importlib import resources
from pathlib import Path

import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import UnsupportedFormatError
from ..io.writers import atomic_file
from . import architectures
from .registry import ModelSpec

INT8_SUFFIX, SCALE_SUFFIX = ".int8", ".scale"


def weights_dir() -> Path:
    """Where weights are looked up: $VISEMZ_WEIGHTS_DIR, else the package's own folder."""
    env = os.environ.get("VISEMZ_WEIGHTS_DIR")
    return Path(env) if env else Path(str(resources.files("visemz.models").joinpath("weights")))


def weights_path(spec: ModelSpec) -> Path:
    return weights_dir() / f"{spec.name}.safetensors"


STORAGES = ("int8", "float32")


def quantize_state(state: dict[str, torch.Tensor], storage: str = "int8") -> dict[str, torch.Tensor]:
    """State dict -> storable tensors: int8 + per-channel scale for 4-D kernels, float32 otherwise
    (``storage="float32"`` keeps the kernels float32 too: the reference the int8 loss is measured against).

    The small tensors stay float32: fp16 would flush constants such as the likelihood
    lower bound (1e-9) and GDN's pedestal (2^-36) to zero."""
    out = {}
    for name, t in state.items():
        t = t.detach().float().cpu()
        if t.dim() == 4 and storage == "int8":  # one scale per slice along dim 0 (output channels; input ones for deconvs)
            amax = t.abs().amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-12)
            scale = amax / 127.0
            out[name + INT8_SUFFIX] = torch.round(t / scale).clamp(-127, 127).to(torch.int8).contiguous()
            out[name + SCALE_SUFFIX] = scale.contiguous()
        else:
            out[name] = t.contiguous()
    return out


def dequantize_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {}
    for name, t in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        if name.endswith(INT8_SUFFIX):
            base = name[: -len(INT8_SUFFIX)]
            state[base] = t.float() * tensors[base + SCALE_SUFFIX]
        else:
            state[name] = t.float()
    return state


def save(model: torch.nn.Module, spec: ModelSpec, path: Path, card: dict, storage: str = "int8") -> str:
    """Write weights (and the model card beside them), each atomically; returns the model id."""
    meta = {"spec": json.dumps({"arch": spec.arch, "variant": spec.variant, "N": spec.N, "M": spec.M,
                                "variable_rate": "gain-units"})}
    with atomic_file(path) as (_, tmp):
        save_file(quantize_state(model.state_dict(), storage), str(tmp), metadata=meta)
    model_id = file_id(path)
    card = dict(card, model=spec.name, model_id=model_id, weights=path.name, storage=storage)
    with atomic_file(path.with_suffix(".json")) as (f, _):
        f.write((json.dumps(card, indent=1) + "\n").encode())
    return model_id


def file_id(path: Path) -> str:
    return xxhash.xxh64(path.read_bytes()).hexdigest()


def read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


_LOAD_LOCK = threading.Lock()


def load(spec: ModelSpec, device: str = "cpu") -> tuple[torch.nn.Module, str]:
    """The model for ``spec`` with its shipped weights, in eval mode, and its model id (cached).

    Thread-safe: several pipeline streams asking at once get one model, fully on the device."""
    with _LOAD_LOCK:
        return _load(spec, device)


@functools.lru_cache(maxsize=32)
def _load(spec: ModelSpec, device: str) -> tuple[torch.nn.Module, str]:
    path = weights_path(spec)
    if not path.is_file():
        raise UnsupportedFormatError(f"no weights for model {spec.name!r} at {path}")
    tensors, meta = read_tensors(path)
    stored = json.loads(meta.get("spec", "{}"))
    if (stored.get("N"), stored.get("M"), stored.get("variable_rate")) != (spec.N, spec.M, "gain-units"):
        raise UnsupportedFormatError(f"weights {path.name} are N={stored.get('N')}, M={stored.get('M')}, "
                                     f"variable rate {stored.get('variable_rate')!r}; expected {spec.N}/{spec.M} with gain units")
    model = architectures.build(spec)
    missing, unexpected = model.load_state_dict(dequantize_state(tensors), strict=False)
    if missing or unexpected:
        raise UnsupportedFormatError(f"weights {path.name} do not match {spec.name}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.eval().requires_grad_(False).to(device)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # copied on this thread's stream; other streams use it next
    return model, file_id(path)


load.cache_clear = _load.cache_clear  # type: ignore[attr-defined]


def available() -> list[str]:
    d = weights_dir()
    return sorted(p.stem for p in d.glob("*.safetensors")) if d.is_dir() else []

