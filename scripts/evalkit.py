"""Shared pieces of the evaluation scripts: eval images, 16-bit mosaics, metrics, timing, the device."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import torch

from visemz import measure
from visemz.evaluation import metrics
from visemz.image import pixels, tiling
from visemz.image.codec import _model64, network_math
from visemz.io.files import IMAGE_EXTENSIONS
from visemz.io.loaders import load_image
from visemz.io.writers import write_atomic
from visemz.models import architectures, registry
from visemz.models import weights as W


def load_folder(folder: Path, gray: bool, limit: int | None = None) -> list[tuple[str, np.ndarray]]:
    out = []
    for p in sorted(folder.iterdir())[:limit]:
        img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR)
        if img is not None:
            out.append((p.name, img if gray else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)))
    return out


def eval_sets(data: Path, variant: str, limit: int | None = None) -> dict[str, list]:
    """RGB models: Kodak.  Grayscale models: the X-ray set and Kodak's luma."""
    if variant == "rgb":
        return {"kodak": load_folder(data / "eval" / "kodak", False, limit)}
    return {"xray": load_folder(data / "eval" / "xray", True, limit),
            "kodak-gray": load_folder(data / "eval" / "kodak", True, limit)}


psnr = measure.psnr  # the peak of the image's dtype: 255 for these 8-bit sets


def ms_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Five-scale MS-SSIM of two 8-bit images, on the GPU when there is one (a 5-Mpixel X-ray takes seconds on a
    CPU)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return metrics.ms_ssim(metrics.to_unit_batch(a, device), metrics.to_unit_batch(b, device))


def bpp(nbytes: int, img: np.ndarray) -> float:
    return measure.bpp(nbytes, measure.pixel_count(img.shape))


def timed(fn, sync=None, repeat: int = 3, warmup: int = 0):
    """(median seconds, last result) of fn(), after ``warmup`` untimed calls, with sync() (e.g.
    torch.cuda.synchronize) around each call."""
    return measure.median_seconds(fn, repeat, warmup=warmup, sync=sync)


def mean(values) -> float:
    return float(np.mean(list(values)))


# ------------------------------------------------------------------------- large 16-bit mosaics
def gray16(img: np.ndarray) -> np.ndarray:
    """One gray uint16 plane of an image: channels averaged, 8-bit values scaled by 257 (0..65535)."""
    x = img.astype(np.float64).mean(axis=2) if img.ndim == 3 else img.astype(np.float64)
    return np.clip(np.round(x * (257 if img.dtype == np.uint8 else 1)), 0, 65535).astype(np.uint16)


def sources(folder: Path) -> list[np.ndarray]:
    """The images under ``folder`` (sorted by name) as gray uint16 planes; exits when there are none."""
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not paths:
        sys.exit(f"no images under {folder}")
    return [gray16(load_image(p)) for p in paths]


def mosaic(images: list[np.ndarray], size: int) -> np.ndarray:
    """An S x S uint16 mosaic of the images, row by row, each placement flipped in turn (so no two
    neighbours repeat); a row is as tall as its tallest image, and the gaps under shorter ones are 0."""
    out = np.zeros((size, size), np.uint16)  # not np.empty: the gaps would hold whatever memory held
    y, k = 0, 0
    while y < size:
        x, row_h = 0, 0
        while x < size:
            img = images[k % len(images)]
            img = img[:, ::-1] if k % 2 else img
            img = img[::-1] if (k // len(images)) % 2 else img
            h, w = min(img.shape[0], size - y), min(img.shape[1], size - x)
            out[y:y + h, x:x + w] = img[:h, :w]
            x, row_h, k = x + w, max(row_h, h), k + 1
        y += row_h
    return out


# ------------------------------------------------------------------------- benchmark folders
def link_or_copy(a: Path, b: Path) -> None:
    """``b`` as a hard link to ``a`` (its folder made), else a copy."""
    b.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(a, b)
    except OSError:  # another file system, or links to files we do not own are refused
        shutil.copyfile(a, b)


def converted_folder(images: list, root: Path, copies: int, ext: str, save) -> Path:
    """The distinct images (``(rel, pixels)`` pairs) written once each by ``save(path, pixels)`` (as
    ``root/rep000/rel + ext``), then linked into ``rep001``.. up to ``copies`` folders in all."""
    shutil.rmtree(root, ignore_errors=True)
    for rel, img in images:
        (root / "rep000" / rel).parent.mkdir(parents=True, exist_ok=True)
        save(root / "rep000" / (rel + ext), img)
    for r in range(1, copies):
        for rel, _ in images:
            link_or_copy(root / "rep000" / (rel + ext), root / f"rep{r:03d}" / (rel + ext))
    return root


# ---------------------------------------------------------------------------------- the device
class Device:
    """The device a benchmark runs on ("cuda" or "cpu"): synchronisation, its name, peak GPU memory."""

    def __init__(self, name: str):
        self.name = name
        self.cuda = name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def describe(self) -> str:
        return torch.cuda.get_device_name() if self.cuda else platform.processor() or "cpu"

    def timed(self, fn, repeats: int, warmup: int = 1) -> tuple[float, object]:
        """(median seconds of ``repeats`` synchronised calls after ``warmup`` untimed ones, last result)."""
        return timed(fn, self.sync, repeats, warmup)

    def peak(self, fn):
        """(result, peak GPU bytes allocated during fn, or None on the CPU)."""
        if not self.cuda:
            return fn(), None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return out, int(torch.cuda.max_memory_allocated())

    def memory(self, fn) -> tuple[object, dict | None]:
        """(result, GPU memory of fn in MiB, or None on the CPU): torch's allocator from a reset of its peak
        statistics (``allocated_peak``: the most its tensors held at once; ``reserved_peak``: the most it took
        from the driver, fragmentation included; ``before``: what it held when fn began, the cached weights
        among it) and cupy's default pool (nvCOMP's buffers; ``cupy_pool``: what the pool holds after fn,
        started empty: its high-water mark, cached blocks included; None without cupy)."""
        if not self.cuda:
            return fn(), None
        pool = _cupy_pool()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if pool is not None:
            pool.free_all_blocks()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        figures = {"allocated_peak": int(torch.cuda.max_memory_allocated()),
                   "reserved_peak": int(torch.cuda.max_memory_reserved()),
                   "before": int(before), "cupy_pool": None if pool is None else int(pool.total_bytes())}
        return out, {k: mib(v) for k, v in figures.items()}


def _cupy_pool():
    """cupy's default device memory pool, or None where cupy is not installed (optional, GPU only)."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy.get_default_memory_pool()


def mib(n):
    """Bytes as MiB to 0.1, None stays None."""
    return None if n is None else round(n / 2**20, 1)


def compressai_encode(net, img: np.ndarray, quality: float, device: str) -> tuple[dict, pixels.ImageMeta]:
    """CompressAI's own compress() of an image (its rANS, its tables, visemz's gained latents and padding):
    (its output, the image's meta for undoing the padding)."""
    t = pixels.as_tensor(img, device)
    meta = pixels.describe(t)
    with torch.inference_mode():
        enc = architectures.compressai_compress(net, pixels.to_batch(t, meta), quality)
    return enc, meta


def latent_symbols(codec, img: np.ndarray, model: str, quality: float):
    """(net, its float64 copy, the symbol tensors) of one image (one tile) as the codec's encode computes them
    on its device: what the scripts that measure the symbols' codings start from."""
    t = pixels.as_tensor(img, "cpu")
    meta = pixels.describe(t)
    spec = registry.spec(model, meta.variant)
    net, _ = W.load(spec, codec.device)
    with network_math():
        net64 = _model64(spec, codec.device)
        _, symbols = next(tiling.analyse(net, t, meta, quality, tiling.grid_for(meta, None), 1, codec.device))
    return net, net64, symbols


def set_cases(data: Path, models: str, qualities: str, limit: int | None = None):
    """(set name, image path, image, model, quality) for every image of every sub-folder of ``data`` (a set),
    model of ``models`` and quality of ``qualities`` (comma-separated): what the per-image scripts walk."""
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)[:limit]:
            img = load_image(path)
            for model in models.split(","):
                for q in (float(v) for v in qualities.split(",")):
                    yield folder.name, path, img, model, q


def write_jsonl(out: Path, rows: list[dict], summary: list[dict], head: dict | None = None) -> None:
    """``rows`` as JSON lines, after ``head`` when given and before ``{"summary": summary}``, written atomically;
    the summary is printed too."""
    lines = ([json.dumps(head)] if head else []) + [json.dumps(r) for r in rows] + [json.dumps({"summary": summary})]
    write_atomic(out, ("\n".join(lines) + "\n").encode())
    for s in summary:
        print(json.dumps(s))
