"""Shared pieces of the evaluation scripts: eval images, metrics, timing."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from visemz import measure
from visemz.evaluation import metrics


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
    return {"xray": load_folder(data / "eval" / "xray", True, limit), "kodak-gray": load_folder(data / "eval" / "kodak", True, limit)}


psnr = measure.psnr  # the peak of the image's dtype: 255 for these 8-bit sets


def ms_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Five-scale MS-SSIM of two 8-bit images, on the GPU when there is one (a 5-Mpixel X-ray takes seconds on a CPU)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return metrics.ms_ssim(metrics.to_unit_batch(a, device), metrics.to_unit_batch(b, device))


def bpp(nbytes: int, img: np.ndarray) -> float:
    return measure.bpp(nbytes, measure.pixel_count(img.shape))


def timed(fn, sync=None, repeat: int = 3):
    """(median seconds, last result) of fn(), with sync() (e.g. torch.cuda.synchronize) around each call."""
    return measure.median_seconds(fn, repeat, sync=sync)


def mean(values) -> float:
    return float(np.mean(list(values)))
