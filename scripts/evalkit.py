"""Shared pieces of the evaluation scripts: eval images, metrics, timing."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import numpy as np


def load_folder(folder: Path, gray: bool, limit: int | None = None) -> list[tuple[str, np.ndarray]]:
    import cv2

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


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 255.0) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * math.log10(peak**2 / mse)


def ms_ssim(a: np.ndarray, b: np.ndarray) -> float:
    import torch
    from pytorch_msssim import ms_ssim as _ms_ssim

    device = "cuda" if torch.cuda.is_available() else "cpu"  # a 5-Mpixel X-ray takes seconds on a CPU

    def t(x):
        x = torch.from_numpy(x.astype(np.float32) / 255.0).to(device)
        return (x[None, None] if x.dim() == 2 else x.permute(2, 0, 1)[None])

    return float(_ms_ssim(t(a), t(b), data_range=1.0))


def bpp(nbytes: int, img: np.ndarray) -> float:
    return 8.0 * nbytes / (img.shape[0] * img.shape[1])


def timed(fn, sync=None, repeat: int = 3):
    """(median seconds, last result) of fn(), with sync() (e.g. torch.cuda.synchronize) around each call."""
    times, out = [], None
    for _ in range(repeat):
        if sync:
            sync()
        t0 = time.perf_counter()
        out = fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def mean(values) -> float:
    return float(np.mean(list(values)))
