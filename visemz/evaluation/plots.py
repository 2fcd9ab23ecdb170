"""The report's figures: RD curves per dataset and side-by-side crops at matched bpp (matplotlib, Agg)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..io.writers import write_atomic
from . import codecs as codec_registry
from .codecs import Layout
from .datasets import find_datasets
from .datasets import load as load_view

CROP = 160  # side of the crop in pixels
DPI = 100


def _figure(rows: int, cols: int, **kw):
    """A figure and its axes, outside pyplot: no global state, no display, nothing to close."""
    fig = Figure(figsize=kw.pop("figsize"))
    return fig, fig.subplots(rows, cols, **kw)


def _save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")  # Agg, matplotlib's own PNG renderer
    write_atomic(path, buf.getvalue())


def rd_plot(dataset: str, curves: dict[str, list[dict]], path: Path) -> None:
    """PSNR-bpp and MS-SSIM-bpp, one line per codec, log-scale bpp (lossless points, of infinite PSNR, left out)."""
    fig, axes = _figure(1, 2, figsize=(13, 5))
    for codec, pts in curves.items():
        pts = [p for p in pts if np.isfinite(p["psnr"])]
        if not pts:
            continue
        style = "--" if pts and pts[0]["kind"] == "bound" else "-"
        style += "s" if codec.startswith("visemz") else "o"
        for ax, metric in zip(axes, ("psnr", "ms_ssim")):
            ax.plot([p["bpp"] for p in pts], [p[metric] for p in pts], style, label=codec, markersize=4)
    for ax, name in zip(axes, ("PSNR (dB)", "MS-SSIM")):
        ax.set_xscale("log")
        ax.set_xlabel("bits per pixel")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{dataset}: rate-distortion (mean over images)")
    _save(fig, path)


def texture_window(image: np.ndarray, side: int) -> tuple[int, int]:
    """Top-left corner of the side x side window (on a half-side grid) with the most variance."""
    g = image.astype(np.float64)
    g = g.mean(axis=2) if g.ndim == 3 else g
    h, w = g.shape
    best, corner = -1.0, (0, 0)
    step = max(side // 2, 1)
    for y in range(0, max(h - side, 0) + 1, step):
        for x in range(0, max(w - side, 0) + 1, step):
            v = float(g[y:y + side, x:x + side].var())
            if v > best:
                best, corner = v, (y, x)
    return corner


def _matched(rows: list[dict], image: str) -> tuple[float, dict[str, dict]]:
    """Target bpp (visemz's middle quality on this image, else the median point) and each codec's closest row."""
    mine = [r for r in rows if r["image"] == image]
    ref = [r for r in mine if r["codec"].startswith("visemz-") and r["kind"] == "rate" and r["setting"] == "q=3"]
    target = float(ref[0]["bpp"]) if ref else float(np.median([float(r["bpp"]) for r in mine]))
    best: dict[str, dict] = {}
    for r in mine:
        gap = abs(np.log(float(r["bpp"]) / target))
        if r["codec"] not in best or gap < abs(np.log(float(best[r["codec"]]["bpp"]) / target)):
            best[r["codec"]] = r
    return target, best


def crop_figure(folder: Path, dataset: str, rows: list[dict], cfg, path: Path) -> bool:
    """The dataset's first image: the original crop beside each codec's crop at the bpp closest to visemz's q=3;
    whether it was drawn.

    The chosen points are re-encoded here (the run keeps no reconstructions), with the
    same codecs and settings as in the CSV.
    """
    ds_rows = [r for r in rows if r["dataset"] == dataset and np.isfinite(float(r["psnr"]))]
    found = find_datasets(folder, cfg.datasets, None, cfg.view)
    if not ds_rows or dataset not in found:  # only lossless points, or a dataset of another view in the CSV
        return False
    paths = {p.name: p for p in found[dataset]}
    name = sorted({r["image"] for r in ds_rows})[0]
    image = load_view(paths[name], cfg.view)
    target, chosen = _matched(ds_rows, name)
    codecs = {c.name: c for c in codec_registry.build_many(cfg.codec_names(), cfg.device, dict(cfg.ladders))
              if c.name in chosen}
    side = min(CROP, *image.shape[:2])
    y, x = texture_window(image, side)
    panels = [("original", image)]
    for cname, r in chosen.items():
        if cname not in codecs:
            continue
        codec = codecs[cname]
        value = float(r["value"])
        rec = codec.decode(codec.encode(image, value), value, Layout.of(image))
        panels.append((f"{cname} {r['setting']}\n{float(r['bpp']):.3f} bpp, {float(r['psnr']):.2f} dB", rec))
    cols = min(4, len(panels))
    rows_n = -(-len(panels) // cols)
    fig, axes = _figure(rows_n, cols, figsize=(3.2 * cols, 3.4 * rows_n), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, (title, img) in zip(axes.ravel(), panels):
        crop = img[y:y + side, x:x + side]
        ax.imshow(crop, cmap="gray" if crop.ndim == 2 else None, vmin=0, vmax=255 if crop.dtype == np.uint8 else 65535,
                  interpolation="nearest")
        ax.set_title(title, fontsize=8)
    fig.suptitle(f"{dataset}/{name}: {side}x{side} crop at about {target:.3f} bpp", fontsize=10)
    _save(fig, path)
    return True
