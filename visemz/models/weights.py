"""Model weights as safetensors: int8 convolution kernels, everything else float32 (gains included).

Convolution kernels (the bulk of every model) are stored as int8 with one float32
scale per output channel; other parameters and buffers (a few KB) as float32.  Loading goes
through ``safetensors`` only: nothing is ever unpickled.  The model id recorded in
every compressed file is the xxh64 of the weights file, so a file written with other
weights is refused instead of decoded into garbage.

Weights are kept loadable by id after an update: a file names the weights it was written with
(``model_id``), and ``load`` takes that id.  The installed weights answer for their own id; older
ones are in the archive (``weights/archive/<id>.safetensors.zst``: the file whose xxh64 is its name, as one zstd
frame, so that the package's weights budget holds more of them; ``archive`` writes one), so a weights update never
makes a file already written unreadable.  Residual priors are archived alike (``residual_weights.py``).

The same file holds the integer CDF tables the codec's rANS coder uses (``tables/...``,
``entropy_tables.py``), computed from the model when it is saved and attached to the
loaded model as ``model.visemz_tables``: a decoder never recomputes them.
"""

from __future__ import annotations

import json
import os
import threading
from importlib import resources
from pathlib import Path

import torch
import xxhash
import zstandard
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from ..errors import UnsupportedFormatError
from ..io.writers import atomic_file
from . import architectures, entropy_tables, graphs
from .registry import ModelSpec

INT8_SUFFIX, SCALE_SUFFIX = ".int8", ".scale"


def weights_dir() -> Path:
    """Where weights are looked up: $VISEMZ_WEIGHTS_DIR, else the package's own folder."""
    env = os.environ.get("VISEMZ_WEIGHTS_DIR")
    return Path(env) if env else package_dir()


def package_dir() -> Path:
    """The package's own weights folder (the shipped files and their archive)."""
    return Path(str(resources.files("visemz.models").joinpath("weights")))


def weights_path(spec: ModelSpec) -> Path:
    return weights_dir() / f"{spec.name}.safetensors"


ARCHIVE = "archive"  # a sub-folder of the weights folder: older weights, each named by its id
ARCHIVED_MAX = 1 << 28  # bytes an archived weights file may declare (the largest shipped file is 7.5 MB)


def archive_path(model_id: str, folder: Path | None = None) -> Path:
    """Where archived weights of id ``model_id`` (16 hex digits, checked by the caller) are: in the archive of
    ``folder``, by default the weights folder's."""
    return (folder or weights_dir()) / ARCHIVE / f"{model_id}.safetensors.zst"


def archive(path: Path) -> str:
    """Put the weights file ``path`` into the archive beside it (one zstd frame, written atomically), as a save does
    before it replaces a file; returns its id."""
    return _archived(path.read_bytes(), path.parent)


def write_weights(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """Write a weights file atomically, archiving the file of other bytes it replaces (the files already written with
    the old weights keep them); returns its id.  The same tensors and metadata make the same bytes, and so the same
    id: safetensors writes the metadata's keys in no fixed order, so the header is written again with them sorted."""
    data = safetensors_bytes(tensors, metadata)
    if path.is_file():
        old = path.read_bytes()
        if old != data:
            _archived(old, path.parent)
    with atomic_file(path) as (f, _):
        f.write(data)
    return id_of(data)


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """A safetensors file's bytes with its metadata's keys in sorted order: the header (a little-endian u64 length,
    then that much JSON, padded with spaces to a multiple of 8 bytes) re-written, the tensors' bytes as they were."""
    data = save_bytes(tensors, metadata=metadata)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n:]


def _archived(data: bytes, folder: Path) -> str:
    model_id = id_of(data)
    target = archive_path(model_id, folder)
    target.parent.mkdir(exist_ok=True)
    with atomic_file(target) as (f, _):
        f.write(zstandard.ZstdCompressor(level=19, write_checksum=True).compress(data))
    return model_id


def read_archived(model_id: str, what: str) -> bytes:
    """The bytes of the archived weights file of id ``model_id``; ``UnsupportedFormatError`` (naming ``what`` the
    file would be) where there is none, it does not decompress or its bytes have another id."""
    path = archive_path(model_id)
    if not path.is_file():
        raise UnsupportedFormatError(f"file was written with weights {model_id} of {what}; this install has no such "
                                     "weights, installed or archived")
    try:
        frame = path.read_bytes()
        # the declared size is checked first: a frame that declares its size is decompressed into that much memory
        size = zstandard.get_frame_parameters(frame).content_size
        if not 0 < size <= ARCHIVED_MAX:
            raise zstandard.ZstdError(f"declares {size} bytes, expected 1..{ARCHIVED_MAX}")
        data = zstandard.ZstdDecompressor().decompress(frame, max_output_size=ARCHIVED_MAX)
    except (zstandard.ZstdError, OSError) as e:
        raise UnsupportedFormatError(f"archived weights {path.name} do not decompress: {e}") from None
    got = id_of(data)
    if got != model_id:
        raise UnsupportedFormatError(f"archived weights {path.name} have the id {got}, not the {model_id} of their "
                                     "name")
    return data


STORAGES = ("int8", "float32")


def quantize_state(state: dict[str, torch.Tensor], storage: str = "int8") -> dict[str, torch.Tensor]:
    """State dict -> storable tensors: int8 + per-channel scale for 4-D kernels, float32 otherwise
    (``storage="float32"`` keeps the kernels float32 too: the reference the int8 loss is measured against).

    The small tensors stay float32: fp16 would flush constants such as the likelihood
    lower bound (1e-9) and GDN's pedestal (2^-36) to zero."""
    out = {}
    for name, t in state.items():
        t = t.detach().float().cpu()
        # one scale per slice along dim 0 (output channels; input ones for deconvs)
        if t.dim() == 4 and storage == "int8":
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
        if name.endswith(SCALE_SUFFIX) or name.startswith(entropy_tables.PREFIX):
            continue
        if name.endswith(INT8_SUFFIX):
            base = name[: -len(INT8_SUFFIX)]
            state[base] = t.float() * tensors[base + SCALE_SUFFIX]
        else:
            state[name] = t.float()
    return state


def save(model: torch.nn.Module, spec: ModelSpec, path: Path, card: dict, storage: str = "int8") -> str:
    """Write weights with their entropy coding tables (and the model card beside them), each
    atomically (a file of other bytes they replace goes into the archive beside it); returns the model id."""
    meta = {"spec": json.dumps({"arch": spec.arch, "variant": spec.variant, "N": spec.N, "M": spec.M,
                                "variable_rate": "gain-units",
                                **({"slices": list(spec.slices)} if spec.context else {})})}
    return _write(path, quantize_state(model.state_dict(), storage), meta, entropy_tables.compute(model),
                  dict(card, storage=storage), spec)


def add_tables(spec: ModelSpec, path: Path) -> str:
    """Re-write a weights file with freshly computed entropy coding tables, its network tensors
    byte for byte as they were (no re-quantisation), and update its card's model id."""
    tensors, meta = read_tensors(path)
    network = {k: v for k, v in tensors.items() if not k.startswith(entropy_tables.PREFIX)}
    model = architectures.build(spec)
    model.load_state_dict(dequantize_state(network))
    card_path = path.with_suffix(".json")
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    return _write(path, network, meta, entropy_tables.compute(model.eval()), card, spec)


def _write(path: Path, network: dict, meta: dict, tables, card: dict, spec: ModelSpec) -> str:
    write_weights(path, dict(network, **entropy_tables.to_tensors(tables)), meta)
    return write_card(path, card, spec)


def write_card(path: Path, card: dict, spec: ModelSpec) -> str:
    """Write the card of the weights file ``path`` beside it (atomically), with its model name and id; returns the
    id.  A card changes without its weights (and their id) changing."""
    model_id = file_id(path)
    card = dict(card, model=spec.name, model_id=model_id, weights=path.name)
    with atomic_file(path.with_suffix(".json")) as (f, _):
        f.write((json.dumps(card, indent=1) + "\n").encode())
    return model_id


def file_id(path: Path) -> str:
    return id_of(path.read_bytes())


def id_of(data: bytes) -> str:
    """A weights file's id: the xxh64 of its bytes, in hex (what an image file records, and its archived name)."""
    return xxhash.xxh64(data).hexdigest()


def read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """A weights file's tensors and metadata; ``UnsupportedFormatError`` where it is not readable."""
    return read_weights(path)[:2]


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict, str]:
    """A weights file's tensors, metadata and id, from one read of its bytes (so that the id is the tensors', even
    where the file is replaced meanwhile); ``UnsupportedFormatError`` where it is not readable."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UnsupportedFormatError(f"weights {path.name} are not readable: {e.strerror}") from None
    return (*tensors_of(data, f"weights {path.name}"), id_of(data))


def tensors_of(data: bytes, name: str = "archived weights") -> tuple[dict[str, torch.Tensor], dict]:
    """A weights file's tensors and metadata from its bytes; the metadata is the ``__metadata__`` entry of the
    safetensors header (a little-endian u64 length, then that much JSON).  ``name``: the file's, for errors."""
    try:
        n = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + n]).get("__metadata__") or {}
        return load_bytes(data), meta
    except (ValueError, AttributeError, RuntimeError, SafetensorError) as e:  # no safetensors header or tensors
        raise UnsupportedFormatError(f"{name} are not a safetensors file: {e}") from None


_LOAD_LOCK = threading.Lock()


def load(spec: ModelSpec, device: str = "cpu", model_id: str | None = None) -> tuple[torch.nn.Module, str]:
    """The model for ``spec`` in eval mode and its model id (cached): with the installed weights, or with
    the weights of ``model_id`` (a file's), the installed ones when that is their id, else the archived
    ones of that id (``UnsupportedFormatError`` when there are none).

    Thread-safe: several pipeline streams asking at once get one model, fully on the device.  Built
    outside inference mode whatever the caller's, so the cached model's tensors are ordinary ones that
    autograd may use later (encoder-side refinement differentiates through the model, ``visemz/image/refine.py``)."""
    installed = _cached((spec, device, None), lambda: _load(spec, device, weights_path(spec)))
    if model_id is None or model_id == installed[1]:
        return installed
    return _cached((spec, device, model_id), lambda: _load_archived(spec, device, model_id, installed[1]))


def _cached(key: tuple, make) -> tuple[torch.nn.Module, str]:
    hit = _LOADED.get(key)
    if hit is not None:  # the common case, without the lock and the inference-mode switch (host time)
        return hit
    with _LOAD_LOCK, torch.inference_mode(False):
        hit = _LOADED.get(key)
        if hit is None:
            hit = make()
            while len(_LOADED) >= _LOADED_MAX:
                del _LOADED[next(iter(_LOADED))]  # the oldest load
            _LOADED[key] = hit
        return hit


# (spec, device, id or None) -> model and id, read without the lock
_LOADED: dict[tuple, tuple[torch.nn.Module, str]] = {}
_LOADED_MAX = 32


def _cache_clear() -> None:
    with _LOAD_LOCK:
        _LOADED.clear()


def _load_archived(spec: ModelSpec, device: str, model_id: str, installed: str) -> tuple[torch.nn.Module, str]:
    data = read_archived(model_id, f"{spec.name} (installed: {installed})")
    return _built(spec, device, *tensors_of(data), archive_path(model_id).name), model_id


def _load(spec: ModelSpec, device: str, path: Path) -> tuple[torch.nn.Module, str]:
    if not path.is_file():
        raise UnsupportedFormatError(f"no weights for model {spec.name!r} at {path}")
    tensors, meta, model_id = read_weights(path)
    return _built(spec, device, tensors, meta, path.name), model_id


def _built(spec: ModelSpec, device: str, tensors: dict, meta: dict, name: str) -> torch.nn.Module:
    """The model of ``spec`` on ``device`` from a weights file's tensors and metadata (``name``: the file's, for
    errors)."""
    stored = json.loads(meta.get("spec", "{}"))
    if (stored.get("arch"), stored.get("variant"), stored.get("N"), stored.get("M"), stored.get("variable_rate")) != \
            (spec.arch, spec.variant, spec.N, spec.M, "gain-units"):
        raise UnsupportedFormatError(f"weights {name} are {stored.get('arch')}-{stored.get('variant')} "
                                     f"N={stored.get('N')}, M={stored.get('M')}, variable rate "
                                     f"{stored.get('variable_rate')!r}; expected {spec.name} {spec.N}/{spec.M} with "
                                     "gain units")
    if stored.get("slices", []) != list(spec.slices):
        raise UnsupportedFormatError(f"weights {name} code their latent in slices {stored.get('slices')}; "
                                     f"{spec.name} expects {list(spec.slices) or 'none'}")
    model = architectures.build(spec)
    missing, unexpected = model.load_state_dict(dequantize_state(tensors), strict=False)
    if missing or unexpected:
        raise UnsupportedFormatError(f"weights {name} do not match {spec.name}: missing {missing[:3]}, unexpected "
                                     f"{unexpected[:3]}")
    model.visemz_tables = entropy_tables.from_tensors(tensors, architectures.has_hyperprior(model), name)
    architectures.freeze_gdn(model.eval().requires_grad_(False).to(device))
    if torch.device(device).type == "cuda":
        graphs.synchronize(device)  # copied on this thread's stream; other streams use it next
    return model


load.cache_clear = _cache_clear  # type: ignore[attr-defined]


def available() -> list[str]:
    d = weights_dir()
    return sorted(p.stem for p in d.glob("*.safetensors")) if d.is_dir() else []

