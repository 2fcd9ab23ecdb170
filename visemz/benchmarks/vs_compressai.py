"""CompressAI's own compress()/decompress() (rANS on the CPU) against visemz, same weights.

    python -m visemz.benchmarks.vs_compressai --data DATA --out compare.json [--limit N] [--no-cpu]
    python -m visemz.benchmarks.vs_compressai --summarise compare.json     # the summary of an earlier run

For every shipped model at each --qualities point (default CompressAI's ladder 1-8): bpp, PSNR and MS-SSIM on
Kodak (RGB models) and on the X-ray set (grayscale models), and milliseconds per image for compress + decompress:
CompressAI with its model on the GPU (its rANS runs on the CPU; the evaluation's ``compressai-<arch>``
codec, ``visemz.evaluation.codecs.learned.CompressAIRans``: a decodable stream of CompressAI's strings), visemz
on the GPU, and visemz on the CPU.  Times are medians over --repeat runs after one warm-up, with
torch.cuda.synchronize() around each timed call.  The device name is printed.

The summary (printed, and stored in the JSON) gives per model and quality visemz's bpp over
CompressAI's and its speedup, and per architecture the BD-PSNR of each coder's Kodak curve
against CompressAI's published zoo curve (``--published``; Bjontegaard, PCHIP; by default the curves kept
in a checkout's docs/results/rd, none when that file is absent).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import visemz
from visemz import markdown, measure
from visemz.benchmarks.common import ms_ssim
from visemz.evaluation import bjontegaard
from visemz.evaluation.codecs.learned import CompressAIRans
from visemz.evaluation.datasets import model_sets
from visemz.io.writers import write_atomic
from visemz.models import all_specs
from visemz.models import weights as W

# in a checkout: the repository's docs (an installed package has none: then no published curve)
PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "results" / "rd" / "compressai_published_kodak.json"
ZOO_NAMES = {"balle2016": "bmshj2018-factorized", "mbt2018-mean": "mbt2018-mean"}


def round_trip(codec, img: np.ndarray, quality: float) -> tuple[int, np.ndarray]:
    """(bytes, reconstruction) of one image through ``codec`` (an evaluation codec) at ``quality``."""
    data, rec = codec.round_trip(img, quality)
    return len(data), rec


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=None, help="the data folder, e.g. DATA: its eval/kodak and eval/xray")
    ap.add_argument("--out", type=Path, default=Path("compare_compressai.json"))
    ap.add_argument("--limit", type=int, default=None, help="first N images of each set")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-cpu", action="store_true", help="skip visemz on the CPU")
    ap.add_argument("--models", nargs="*", default=None, help="e.g. balle2016-rgb (default: all shipped)")
    ap.add_argument("--qualities", default="1,2,3,4,5,6,7,8", help="comma-separated qualities in [1, 8]")
    ap.add_argument("--published", type=Path, default=PUBLISHED, help="CompressAI's published Kodak curves (JSON)")
    ap.add_argument("--summarise", type=Path, default=None, help="print the summary of an earlier run's JSON and stop")
    args = ap.parse_args(argv)
    published = json.loads(args.published.read_text()) if args.published.is_file() else None
    if args.summarise:
        report = json.loads(args.summarise.read_text())
        print_summary(report["device"], summarise(report["rows"], published))
        return
    if args.data is None:
        ap.error("--data is required (unless --summarise)")

    cuda = torch.cuda.is_available()
    dev_name = torch.cuda.get_device_name() if cuda else "CPU only"
    print(f"device: {dev_name}")
    sync = torch.cuda.synchronize if cuda else None
    main_dev = "cuda" if cuda else "cpu"
    vz_gpu, vz_cpu = (visemz.ImageCodec("cuda") if cuda else None), visemz.ImageCodec("cpu")
    specs = [s for s in all_specs() if W.weights_path(s).is_file() and (not args.models or s.name in args.models)]
    rows = []
    qualities = [float(q) for q in args.qualities.split(",")]
    references = {}  # arch -> CompressAI's coder with visemz's weights (its models loaded once per variant)
    for spec, quality in ((s, q) for s in specs for q in qualities):
        ref = references.setdefault(spec.arch, CompressAIRans(spec.arch, main_dev))
        for set_name, images in model_sets(args.data, spec.variant, args.limit).items():
            if set_name == "kodak-gray":
                continue
            acc = {k: [] for k in ("ca", "gpu", "cpu")}
            for i, (_, img) in enumerate(images):
                rep = args.repeat if i == 0 or img.size < 2_000_000 else 1
                t_ca, (n_ca, rec_ca) = measure.median_seconds(lambda: round_trip(ref, img, quality), rep,
                                                              warmup=int(i == 0), sync=sync)
                acc["ca"].append((n_ca, rec_ca, t_ca))
                for key, codec in (("gpu", vz_gpu), ("cpu", vz_cpu)):
                    if codec is None or (key == "cpu" and args.no_cpu):
                        continue
                    run = lambda: (lambda b: (len(b), codec.decompress(b)))(
                        codec.compress(img, model=spec.arch, quality=quality))
                    t, (n, rec) = measure.median_seconds(run, rep if key == "gpu" else 1, warmup=int(i == 0),
                                                         sync=sync if key == "gpu" else None)
                    acc[key].append((n, rec, t))
            for key, vals in acc.items():
                if not vals:
                    continue
                row = {
                    "model": spec.name, "quality": quality, "set": set_name,
                    "coder": {"ca": "compressai-rans", "gpu": "visemz-gpu", "cpu": "visemz-cpu"}[key],
                    "images": len(vals),
                    "bpp": mean(measure.bpp(n, measure.pixel_count(img.shape))
                                for (n, _, _), (_, img) in zip(vals, images)),
                    "psnr": mean(measure.psnr(img, rec) for (_, rec, _), (_, img) in zip(vals, images)),
                    "ms_ssim": mean(ms_ssim(img, rec) for (_, rec, _), (_, img) in zip(vals, images)),
                    "ms_per_image": 1e3 * float(np.median([t for _, _, t in vals])),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_atomic(args.out, json.dumps({"device": dev_name, "rows": rows}, indent=1).encode())  # rows first
    summary = summarise(rows, published)
    write_atomic(args.out, json.dumps({"device": dev_name, "rows": rows, "summary": summary}, indent=1).encode())
    print_table(dev_name, rows)
    print_summary(dev_name, summary)


def mean(values) -> float:
    return float(np.mean(list(values)))


def summarise(rows: list[dict], published: dict | None) -> dict:
    """visemz-gpu against compressai-rans per (model, set): bpp ratio and speedup; and per
    architecture and coder, BD-PSNR (dB) on Kodak against the published zoo curve."""
    by = {(r["model"], r["quality"], r["set"], r["coder"]): r for r in rows}
    pairs = []
    for (model, quality, set_name, coder), r in by.items():
        ca = by.get((model, quality, set_name, "compressai-rans"))
        if coder == "compressai-rans" or ca is None:
            continue
        pairs.append({"model": model, "quality": quality, "set": set_name, "coder": coder,
                      "bpp_ratio": round(r["bpp"] / ca["bpp"], 3),
                      "psnr_delta_db": round(r["psnr"] - ca["psnr"], 3),
                      "speedup": round(ca["ms_per_image"] / r["ms_per_image"], 2)})
    bd = []
    for arch, zoo in ZOO_NAMES.items():
        if not published or zoo not in published:
            continue
        ref = published[zoo]
        for coder in sorted({c for (_, _, _, c) in by}):
            curve = sorted((r["bpp"], r["psnr"]) for (m, _, s_, c), r in by.items()
                           if c == coder and s_ == "kodak" and m == arch + "-rgb")
            if len(curve) >= 2:
                try:
                    gap = round(bjontegaard.bd_quality(ref["bpp"], ref["psnr"], [b for b, _ in curve],
                                                       [p for _, p in curve]), 2)
                except bjontegaard.BDError as e:  # e.g. a coder that mis-decoded some images (non-monotone curve)
                    bd.append({"arch": arch, "coder": coder, "bd_psnr_db_vs_published": None, "why": str(e)})
                    continue
                bd.append({"arch": arch, "coder": coder, "bd_psnr_db_vs_published": gap})
    return {"pairs": pairs, "bd_vs_published_kodak": bd}


def print_summary(name: str, summary: dict) -> None:
    print(f"\n{name}: against CompressAI's rANS with the same weights")
    head = ["model", "quality", "set", "coder", "bpp ratio", "PSNR delta dB", "speedup"]
    print("\n".join(markdown.table(head, ([p["model"], f"{p['quality']:g}", p["set"], p["coder"], p["bpp_ratio"],
                                          p["psnr_delta_db"], p["speedup"]] for p in summary["pairs"]))))
    for b in summary["bd_vs_published_kodak"]:
        gap = b["bd_psnr_db_vs_published"]
        print(f"BD-PSNR on Kodak against CompressAI's published {b['arch']}: {b['coder']} "
              + (f"{gap} dB" if gap is not None else f"n/a ({b['why']})"))


def print_table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}: compress + decompress, same weights")
    head = ["model", "quality", "set", "coder", "bpp", "PSNR dB", "MS-SSIM", "ms/image"]
    print("\n".join(markdown.table(head, ([r["model"], f"{r['quality']:g}", r["set"], r["coder"], f"{r['bpp']:.4f}",
                                          f"{r['psnr']:.2f}", f"{r['ms_ssim']:.4f}", f"{r['ms_per_image']:.1f}"]
                                         for r in rows))))


if __name__ == "__main__":
    main()
