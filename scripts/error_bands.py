"""Where a codec's error lies in frequency: visemz against JPEG 2000 on one image, at about equal rate.

    python scripts/error_bands.py --image DATA/eval/xray/xray_15.png --qualities 1 3 4 \
        --j2k-bpp 0.02 0.05 --device cpu [--out bands.json]

Each file is real (bpp from its bytes).  The error e = decoded - original (in the image's own
levels) is split by two Gaussian low-passes into three bands whose mean squares are reported:
low (blur of sigma 8 pixels: what changes over tens of pixels, e.g. the hyper-latent's 64-pixel
blotches), mid (sigma 2 less sigma 8) and high (e less its sigma-2 blur: grain and edges).  The
bands are not exactly orthogonal, so they need not add up to the MSE, which is reported beside
them.  Gray and RGB images both work (RGB: the bands of all channels together).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np

import visemz
from visemz import measure
from visemz.evaluation.codecs.base import Layout
from visemz.evaluation.codecs.raster import JPEG2000
from visemz.io.loaders import InputError, load_image
from visemz.io.writers import write_atomic

SIGMAS = (8.0, 2.0)


def bands(original: np.ndarray, decoded: np.ndarray) -> dict:
    """MSE and the mean squares of the error's low / mid / high bands (see the module docstring)."""
    e = decoded.astype(np.float32) - original.astype(np.float32)
    wide, narrow = (cv2.GaussianBlur(e, (0, 0), s) for s in SIGMAS)
    ms = lambda a: round(float(np.mean(np.square(a, dtype=np.float64))), 4)  # noqa: E731
    return {"mse": ms(e), "low": ms(wide), "mid": ms(narrow - wide), "high": ms(e - narrow)}


def row(codec: str, setting: float, data: bytes, original: np.ndarray, decoded: np.ndarray) -> dict:
    r = {"codec": codec, "setting": setting,
         "bpp": round(measure.bpp(len(data), measure.pixel_count(original.shape)), 5),
         "psnr": round(measure.psnr(original, decoded), 3), **bands(original, decoded)}
    print(json.dumps(r), flush=True)
    return r


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--qualities", type=float, nargs="+", default=[1.0, 3.0, 4.0])
    ap.add_argument("--model", default="mbt2018-mean")
    ap.add_argument("--j2k-bpp", type=float, nargs="*", default=[0.02, 0.05])
    ap.add_argument("--device", default=None, help="visemz's device (default: VISEMZ_DEVICE)")
    ap.add_argument("--out", type=Path, default=None, help="a JSON of the rows")
    args = ap.parse_args(argv)
    try:
        img = load_image(args.image)  # RGB channel order, the file's own dtype
    except InputError as e:
        raise SystemExit(str(e)) from None
    if img.dtype != np.uint8 or not (img.ndim == 2 or img.shape[2] == 3):
        raise SystemExit(f"{args.image}: expected an 8-bit gray or RGB image, got {img.dtype} {img.shape}")
    rows = []
    for q in args.qualities:
        data = visemz.compress(img, quality=q, model=args.model, device=args.device)
        rows.append(row(f"visemz-{args.model}", q, data, img, visemz.decompress(data, device=args.device)))
    j2k = JPEG2000()
    for bpp in args.j2k_bpp:
        data = j2k.encode(img, bpp)
        rows.append(row("jpeg2000", bpp, data, img, j2k.decode(data, bpp, Layout(img.shape, str(img.dtype)))))
    if args.out:
        write_atomic(args.out, (json.dumps({"image": str(args.image), "sigmas": SIGMAS, "rows": rows}, indent=1)
                                + "\n").encode())
    return rows


if __name__ == "__main__":
    main()
