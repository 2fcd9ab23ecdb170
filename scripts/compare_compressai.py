"""CompressAI's own compress()/decompress() (rANS on the CPU) against visemz, same weights.

    python scripts/compare_compressai.py --data ../shared/data --out compare.json [--limit N] [--no-cpu]

For every shipped model and quality: bpp, PSNR and MS-SSIM on Kodak (RGB models) and on the
X-ray set (grayscale models), and milliseconds per image for compress + decompress:
CompressAI with its model on the GPU (its rANS runs on the CPU), visemz on the GPU, and
visemz on the CPU.  Times are medians over --repeat runs after one warm-up, with
torch.cuda.synchronize() around each timed call.  The device name is printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import evalkit
import visemz
from visemz import pixels
from visemz.models import all_specs, architectures
from visemz.models import weights as W


def compressai_roundtrip(net, img: np.ndarray, device: str):
    """CompressAI's own codec on an image: (bytes, reconstruction), same padding as visemz."""
    t = pixels.as_tensor(img, device)
    meta = pixels.describe(t)
    x = pixels.to_batch(t, meta)
    with torch.inference_mode():
        enc = net.compress(x)
        dec = net.decompress(enc["strings"], enc["shape"])
    nbytes = sum(len(s) for group in enc["strings"] for s in group)
    rec = pixels.denormalise(pixels.from_batch(dec["x_hat"], meta), meta).cpu().numpy()
    return nbytes, rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", default="compare_compressai.json")
    ap.add_argument("--limit", type=int, default=None, help="first N images of each set")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-cpu", action="store_true", help="skip visemz on the CPU")
    ap.add_argument("--models", nargs="*", default=None, help="e.g. balle2016-rgb-q3 (default: all shipped)")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dev_name = torch.cuda.get_device_name() if cuda else "CPU only"
    print(f"device: {dev_name}")
    sync = torch.cuda.synchronize if cuda else None
    main_dev = "cuda" if cuda else "cpu"
    vz_gpu, vz_cpu = (visemz.ImageCodec("cuda") if cuda else None), visemz.ImageCodec("cpu")
    specs = [s for s in all_specs() if W.weights_path(s).is_file() and (not args.models or s.name in args.models)]
    rows = []
    for spec in specs:
        net, _ = W.load(spec, main_dev)
        ref = architectures.build(spec).to(main_dev).eval()
        ref.load_state_dict(net.state_dict())
        ref.update(force=True)  # CompressAI's CDF tables for its rANS coder
        for set_name, images in evalkit.eval_sets(args.data, spec.variant, args.limit).items():
            if set_name == "kodak-gray":
                continue
            acc = {k: [] for k in ("ca", "gpu", "cpu")}
            for i, (_, img) in enumerate(images):
                rep = args.repeat if i == 0 or img.size < 2_000_000 else 1
                if i == 0:
                    compressai_roundtrip(ref, img, main_dev)  # warm-up
                t_ca, (n_ca, rec_ca) = evalkit.timed(lambda: compressai_roundtrip(ref, img, main_dev), sync, rep)
                acc["ca"].append((n_ca, rec_ca, t_ca))
                for key, codec in (("gpu", vz_gpu), ("cpu", vz_cpu)):
                    if codec is None or (key == "cpu" and args.no_cpu):
                        continue
                    run = lambda: (lambda b: (len(b), codec.decompress(b)))(codec.compress(img, model=spec.arch, quality=spec.quality))
                    if i == 0:
                        run()
                    t, (n, rec) = evalkit.timed(run, sync if key == "gpu" else None, rep if key == "gpu" else 1)
                    acc[key].append((n, rec, t))
            for key, vals in acc.items():
                if not vals:
                    continue
                row = {
                    "model": spec.name, "set": set_name, "coder": {"ca": "compressai-rans", "gpu": "visemz-gpu", "cpu": "visemz-cpu"}[key],
                    "images": len(vals),
                    "bpp": evalkit.mean(evalkit.bpp(n, img) for (n, _, _), (_, img) in zip(vals, images)),
                    "psnr": evalkit.mean(evalkit.psnr(img, rec) for (_, rec, _), (_, img) in zip(vals, images)),
                    "ms_ssim": evalkit.mean(evalkit.ms_ssim(img, rec) for (_, rec, _), (_, img) in zip(vals, images)),
                    "ms_per_image": 1e3 * float(np.median([t for _, _, t in vals])),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": dev_name, "rows": rows}, f, indent=1)
    print_table(dev_name, rows)


def print_table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}: compress + decompress, same weights")
    print("| model | set | coder | bpp | PSNR dB | MS-SSIM | ms/image |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['set']} | {r['coder']} | {r['bpp']:.4f} | {r['psnr']:.2f} | {r['ms_ssim']:.4f} | {r['ms_per_image']:.1f} |")


if __name__ == "__main__":
    main()
