"""An exposure stack for the stacking benchmark: noisy repeats of one real frame (same scene, same shape).

    python tools/make_exposure_stack.py SRC_FOLDER DST_FOLDER [--frames 32] [--photons 4] [--seed 0]

The first image of SRC_FOLDER (as visemz's folder tools order them) is read as float64; each frame
is Poisson(photons x pixel) / photons, a shot-noise exposure of that scene, written as a float32 TIFF
(``frame_000.tif`` ...) atomically.  ``bench_scaling.sh`` stacks them with ``python -m visemz stack``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from visemz.io import files, loaders
from visemz.io.writers import write_atomic


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="folder of images; its first image is the scene")
    ap.add_argument("dst", type=Path, help="folder for the frames (made if missing)")
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--photons", type=float, default=4.0, help="photons per unit of pixel value (lower: noisier)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.frames < 1 or args.photons <= 0:
        raise SystemExit(f"--frames {args.frames} / --photons {args.photons}: expected at least 1 frame and "
                         "photons > 0")
    found = files.discover(args.src, files.IMAGE_EXTENSIONS)
    if not found:
        raise SystemExit(f"no images in {args.src}")
    scene = loaders.load_image(found[0]).astype(np.float64)
    args.dst.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for i in range(args.frames):
        frame = (rng.poisson(scene * args.photons) / args.photons).astype(np.float32)
        dst = args.dst / f"frame_{i:03d}.tif"
        write_atomic(dst, loaders.save_image(dst, frame, "tiff"))
    print(f"{args.frames} frames of {found[0].name} {scene.shape} in {args.dst}")


if __name__ == "__main__":
    main()
