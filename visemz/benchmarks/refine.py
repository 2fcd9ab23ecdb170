"""What encoder-side latent refinement (``visemz/image/refine.py``) buys: rate, quality and encode time.

    python -m visemz.benchmarks.refine --data DATA/eval --set kodak \
        --models mbt2018-mean balle2016 --steps 0 50 150 --qualities 1 2 3 4 5 6 7 8 \
        --images 24 --device cuda --out refine_kodak.json [--lr 0.02] [--rounding sga]

For every model, step count, quality and image: bpp from the real file's bytes, PSNR from the
real decode (``visemz.measure``: the bit depth's range, as ``visemz eval``), the training
loss measured on them (bpp + lambda * 255^2 * MSE on [0, 1]) and the encode seconds (device
synchronised; each model is warmed up on the first image first).  Then per model, on the mean
curves over the images (as the rd report averages them): the BD-rate (PSNR) of each refined curve
against steps 0, and against JPEG 2000 on the same images when ``--points`` (the rd report's
points.csv) holds JPEG 2000 points for every one of them; and the encode cost: the seconds per
image that 100 steps add, against steps 0 of the same run (the whole encode, an upper bound, when
steps 0 is not measured), on the device the JSON names.  The JSON is rewritten after every
(model, steps) curve, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from visemz import measure
from visemz.cuda import resolve
from visemz.evaluation.bjontegaard import BDError, bd_rate
from visemz.evaluation.datasets import find_datasets
from visemz.evaluation.report import device_name, frontier
from visemz.image.codec import ImageCodec
from visemz.image.refine import RefineSettings
from visemz.io.loaders import load_image
from visemz.io.writers import write_atomic
from visemz.models import registry

ANCHOR = "jpeg2000"
# in a checkout: the rd report kept in the repository's docs (an installed package has none: then no anchor)
RD_POINTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "rd" / "points.csv"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the evaluation root (with kodak/ and xray/)")
    ap.add_argument("--set", default="kodak", help="the sub-folder of --data to measure")
    ap.add_argument("--models", nargs="+", default=list(registry.ARCHITECTURES), choices=registry.ARCHITECTURES)
    ap.add_argument("--steps", nargs="+", type=int, default=[0, 50, 150])
    ap.add_argument("--qualities", nargs="+", type=float, default=[1, 2, 3, 4, 5, 6, 7, 8])
    ap.add_argument("--images", type=int, default=None, help="the first N images of the set (default: all)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--lr", type=float, default=RefineSettings.lr)
    ap.add_argument("--rounding", default=RefineSettings.rounding, choices=("sga", "ste"))
    ap.add_argument("--points", type=Path, default=RD_POINTS,
                    help="the rd report's points.csv, for the JPEG 2000 anchor (default: the checkout's)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    return ap.parse_args(argv)


def load_set(data: Path, name: str, limit: int | None) -> dict[str, np.ndarray]:
    paths = find_datasets(data, (name,), limit)[name]
    return {p.name: load_image(p) for p in paths}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_point(codec: ImageCodec, img: np.ndarray, model: str, quality: float, settings: RefineSettings) -> dict:
    """Compress (timed), decompress and score one image."""
    sync(codec.device)
    t0 = time.perf_counter()
    buf = codec.compress(img, model=model, quality=quality, refine=settings)
    sync(codec.device)
    seconds = time.perf_counter() - t0
    rec = codec.decompress(buf)
    bpp = measure.bpp(len(buf), measure.pixel_count(img.shape))
    mse01 = measure.mse(img, rec) / measure.peak(img) ** 2
    return {"bytes": len(buf), "bpp": bpp, "psnr": measure.psnr(img, rec),
            "rd_cost": bpp + registry.lam(quality) * 255**2 * mse01, "encode_s": seconds}


def mean_curve(points: list[dict]) -> list[dict]:
    """One point per quality: bpp, PSNR, RD cost and encode seconds averaged over the images, sorted by bpp."""
    by_q = defaultdict(list)
    for p in points:
        by_q[p["quality"]].append(p)
    curve = [{"quality": q, "images": len(ps), **{f: float(np.mean([p[f] for p in ps]))
                                                  for f in ("bpp", "psnr", "rd_cost", "encode_s")}}
             for q, ps in by_q.items()]
    return sorted(curve, key=lambda p: p["bpp"])


def bd(anchor: list[dict], test: list[dict]) -> float | str:
    """BD-rate (PSNR, %) of test against anchor on their non-dominated points, or why there is none."""
    a, t = frontier(anchor, "psnr"), frontier(test, "psnr")
    try:
        return bd_rate([p["bpp"] for p in a], [p["psnr"] for p in a], [p["bpp"] for p in t], [p["psnr"] for p in t])
    except BDError as e:
        return f"n/a: {e}"


def anchor_curve(points_csv: Path, dataset: str, images: list[str]) -> list[dict] | None:
    """JPEG 2000's mean curve over exactly these images (settings that every one of them has), or None."""
    if not points_csv.is_file():
        return None
    rows = defaultdict(dict)
    with open(points_csv, newline="") as f:
        for r in csv.DictReader(f):
            if r["dataset"] == dataset and r["codec"] == ANCHOR and r["image"] in images:
                rows[r["setting"]][r["image"]] = {"bpp": float(r["bpp"]), "psnr": float(r["psnr"])}
    curve = [{"setting": s, "bpp": float(np.mean([v["bpp"] for v in per.values()])),
              "psnr": float(np.mean([v["psnr"] for v in per.values()]))}
             for s, per in rows.items() if set(per) == set(images)]
    return sorted(curve, key=lambda p: p["bpp"]) if len(curve) >= 2 else None


def step_cost(curve: list[dict], base: list[dict] | None, steps: int) -> dict:
    """Encode seconds per image, and what 100 refinement steps add to them: the mean encode seconds less
    steps 0's over the same images and qualities of this run, or without steps 0 the whole encode (an
    upper bound); none for 0 steps."""
    encode_s = float(np.mean([p["encode_s"] for p in curve]))
    extra = encode_s - float(np.mean([p["encode_s"] for p in base])) if base is not None else encode_s
    return {"encode_s_per_image": encode_s,
            "s_per_image_per_100_steps": extra * 100 / steps if steps else None,
            "per_100_steps_is_upper_bound": base is None if steps else None}


def summarise(points: list[dict], anchor: list[dict] | None) -> dict:
    """Per model: each step count's mean curve, its BD-rate against steps 0 and against the anchor, its encode cost."""
    out = {}
    for model in dict.fromkeys(p["model"] for p in points):
        curves = {s: mean_curve([p for p in points if p["model"] == model and p["steps"] == s])
                  for s in dict.fromkeys(p["steps"] for p in points if p["model"] == model)}
        base = curves.get(0)
        out[model] = {str(s): {"curve": c,
                               "bd_rate_vs_steps0": bd(base, c) if base is not None and s != 0 else None,
                               f"bd_rate_vs_{ANCHOR}": bd(anchor, c) if anchor is not None else None,
                               **step_cost(c, base, s)}
                      for s, c in curves.items()}
    return out


def table(summary: dict, device: str) -> str:
    lines = [f"on {device}; s/100: encode seconds per image that 100 steps add (* the whole encode: no steps 0 run)",
             f"{'model':14} {'steps':>5} {'bpp':>7} {'PSNR':>7} {'RD cost':>8} {'enc s':>7} {'s/100':>8} "
             f"{'BD vs 0':>9} {'BD vs ' + ANCHOR:>16}"]
    for model, by_steps in summary.items():
        for s, r in by_steps.items():
            c = r["curve"]
            cells = [_pct(r["bd_rate_vs_steps0"]), _pct(r[f"bd_rate_vs_{ANCHOR}"])]
            per100 = r["s_per_image_per_100_steps"]
            per100 = "-" if per100 is None else f"{per100:.3f}" + ("*" if r["per_100_steps_is_upper_bound"] else "")
            lines.append(f"{model:14} {s:>5} {np.mean([p['bpp'] for p in c]):7.4f} "
                         f"{np.mean([p['psnr'] for p in c]):7.3f} {np.mean([p['rd_cost'] for p in c]):8.4f} "
                         f"{r['encode_s_per_image']:7.3f} {per100:>8} {cells[0]:>9} {cells[1]:>16}")
    return "\n".join(lines)


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.2f}%" if isinstance(v, float) else "n/a"


def main(argv=None) -> None:
    args = parse_args(argv)
    device = resolve(args.device)
    codec = ImageCodec(device)
    images = load_set(args.data, args.set, args.images)
    anchor = anchor_curve(args.points, args.set, list(images))
    name = device_name(device)
    print(f"device: {name}; {len(images)} {args.set} images; anchor {ANCHOR}: "
          f"{'%d points' % len(anchor) if anchor else 'none for these images'}", flush=True)
    result = {"device": name, "set": args.set, "images": list(images), "qualities": args.qualities,
              "settings": {"lr": args.lr, "rounding": args.rounding}, "points": []}
    first = next(iter(images.values()))
    for model in args.models:
        codec.compress(first, model=model, quality=args.qualities[0], refine=RefineSettings(2))  # warm-up
        for steps in args.steps:
            settings = RefineSettings(steps, lr=args.lr, rounding=args.rounding)
            t0 = time.perf_counter()
            for q in args.qualities:
                for label, img in images.items():
                    point = measure_point(codec, img, model, q, settings)
                    result["points"].append({"model": model, "steps": steps, "quality": q, "image": label, **point})
            print(f"{model} steps {steps}: {len(args.qualities) * len(images)} points in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            result["summary"] = summarise(result["points"], anchor)
            write_atomic(args.out, json.dumps(result, indent=1).encode())
    print(table(result["summary"], name))


if __name__ == "__main__":
    main()
