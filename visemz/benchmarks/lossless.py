"""Lossless and near-lossless throughput: visemz on a device beside JPEG XL and JPEG-LS on the CPU, in one run.

    python -m visemz.benchmarks.lossless --image8 XRAY.png --image16 FLUO16.png --size 2048 --device cuda \
        --out bench_lossless.json

Each image is made size x size (cropped, or mirrored out where smaller) so that every codec codes the
same pixels.  Per codec and bound: bits per pixel, and encode and decode megapixels per second, the
median of --reps timed runs after --warmup untimed ones (device work synchronised before the clock is
read); decoded pixels are checked against the bound.  JPEG XL (lossless, effort 7) and JPEG-LS (NEAR =
E) run through imagecodecs with all CPU threads where the codec takes a thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import cv2
import numpy as np

import visemz
from visemz import measure
from visemz.io.writers import write_atomic


def square(img: np.ndarray, size: int) -> np.ndarray:
    """A size x size gray image: the top-left crop, mirrored out along an axis that is too short."""
    if img.ndim == 3:
        img = cv2.cvtColor(img[:, :, :3], cv2.COLOR_BGR2GRAY)
    while img.shape[0] < size or img.shape[1] < size:
        img = np.block([[img, img[:, ::-1]], [img[::-1], img[::-1, ::-1]]])
    return np.ascontiguousarray(img[:size, :size])


def row(name: str, img: np.ndarray, e: int, encode, decode, reps: int, warmup: int, sync) -> dict:
    t_enc, buf = measure.median_seconds(lambda: encode(img), reps, warmup=warmup, sync=sync)
    t_dec, out = measure.median_seconds(lambda: decode(buf), reps, warmup=warmup, sync=sync)
    err = int(np.abs(np.asarray(out).astype(np.int64) - img.astype(np.int64)).max())
    mp = img.size / 1e6
    return {"codec": name, "dtype": img.dtype.name, "max_error": e, "bpp": 8 * len(buf) / img.size,
            "encode_mp_s": mp / t_enc, "decode_mp_s": mp / t_dec, "encode_s": t_enc, "decode_s": t_dec,
            "measured_max_error": err, "bound_held": err <= e}


def classical(e: int, threads: int) -> dict:
    import imagecodecs

    codecs = {"jpeg-ls": (lambda x: imagecodecs.jpegls_encode(x, level=e), imagecodecs.jpegls_decode)}
    if e == 0:
        codecs["jpeg-xl-e7"] = (lambda x: imagecodecs.jpegxl_encode(x, lossless=True, effort=7, numthreads=threads),
                                lambda b: imagecodecs.jpegxl_decode(b, numthreads=threads))
    return codecs


def main(argv=None) -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--image8", type=Path, required=True)
    a.add_argument("--image16", type=Path, required=True)
    a.add_argument("--size", type=int, default=2048)
    a.add_argument("--device", default="cuda")
    a.add_argument("--bounds", default="0,2")
    a.add_argument("--quality", type=float, default=None,
                   help="visemz's lossy quality (default: the codec's for max_error)")
    a.add_argument("--formats", default="", help="image formats of visemz to run side by side, e.g. 9,8 (default: "
                   "the codec's own)")
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--warmup", type=int, default=2)
    a.add_argument("--out", type=Path, required=True)
    args = a.parse_args(argv)
    import torch

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    threads = os.cpu_count() or 1
    print(f"device: {device_name} ({args.device}); {threads} CPU threads", flush=True)
    codec = visemz.ImageCodec(args.device)
    kw = {} if args.quality is None else {"quality": args.quality}
    formats = [int(f) for f in args.formats.split(",") if f] or [None]
    rows = []
    for path in (args.image8, args.image16):
        img = square(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), args.size)
        for e in (int(v) for v in args.bounds.split(",")):
            for fmt in formats:
                name = f"visemz ({args.device})" if fmt is None else f"visemz format {fmt} ({args.device})"
                rows.append(row(name, img, e, lambda x: codec.compress(x, max_error=e, image_format=fmt, **kw),
                                codec.decompress, args.reps, args.warmup, sync))
            for name, (enc, dec) in classical(e, threads).items():
                rows.append(row(f"{name} (cpu, {threads} threads)", img, e, enc, dec, args.reps, args.warmup,
                                lambda: None))
            for r in rows[-len(formats) - len(classical(e, threads)):]:
                r["image"] = path.name
                print(f"{path.name} {r['dtype']} E={e} {r['codec']:32s} {r['bpp']:.3f} bpp  enc "
                      f"{r['encode_mp_s']:8.1f} MP/s  dec {r['decode_mp_s']:8.1f} MP/s  max err "
                      f"{r['measured_max_error']}", flush=True)
    report = {"device": device_name, "cpu_threads": threads, "size": args.size, "visemz": visemz.__version__,
              "reps": args.reps, "warmup": args.warmup, "rows": rows}
    write_atomic(args.out, (json.dumps(report, indent=1) + "\n").encode())


if __name__ == "__main__":
    main()
