"""Tiled compression on large 16-bit images: peak GPU memory, throughput, region reads, seams.

    python scripts/bench_tiles.py --out docs/results/bench_tiles_h200.json
    python scripts/bench_tiles.py --sizes 256 512 --device cpu --kodak-images 1 --qualities 1 8 --out /tmp/t.json

For each size S of ``--sizes``: an S x S uint16 mosaic of the images under ``--data`` (gray; 8-bit
images scaled by 257; each placement flipped differently so no two neighbours repeat), compressed
tile by tile and decompressed, with the peak GPU memory of each (torch.cuda.max_memory_allocated
after a reset) and Mpixel/s (median of ``--repeats`` after a warm-up, synchronised).  Then:

- the untiled path (image format 3, one tile) at doubling sizes from 1024 until it fails (out of
  memory or a limit), the largest it did with its memory and throughput;
- per-pixel throughput on the Kodak images (``--kodak``), which fit one tile, and the ratio of the
  largest mosaic's tiled throughput to it;
- a 1024 x 1024 region of the largest mosaic's file (off the tile grid) against its full decode;
- seams: PSNR and bpp of tiled (``--seam-tile``) against untiled compression of Kodak images at each
  of ``--qualities``.

visemz against JPEG 2000 and JPEG XL on chunks of such a mosaic, through Zarr: scripts/bench_zarr.py.

Prints the device and writes everything as JSON to ``--out`` (atomically).  Data never ships with the repo.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import torch

import visemz
from evalkit import Device, gray16, mib, mosaic, sources
from visemz import container, measure
from visemz.config import DEFAULTS
from visemz.errors import LimitExceededError
from visemz.io.loaders import load_image
from visemz.io.writers import write_atomic

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "eval"


def round_trip(dev: Device, img: np.ndarray, compress, decompress, repeats: int) -> tuple[bytes, np.ndarray, dict]:
    """Peak memory of one compress and one decompress, then their median times: (file, image, figures)."""
    buf, enc_peak = dev.peak(compress)
    _, dec_peak = dev.peak(lambda: decompress(buf))
    t_enc, _ = dev.timed(compress, repeats)
    t_dec, out = dev.timed(lambda: decompress(buf), repeats)
    mpx = img.size / 1e6
    return buf, out, {"compress_s": round(t_enc, 4), "decompress_s": round(t_dec, 4),
                      "compress_mpx_s": round(mpx / t_enc, 2), "decompress_mpx_s": round(mpx / t_dec, 2),
                      "compress_peak_mib": mib(enc_peak), "decompress_peak_mib": mib(dec_peak)}


def bench_size(dev: Device, img: np.ndarray, args) -> tuple[dict, bytes]:
    opts = dict(model=args.model, quality=args.quality, device=dev.name, tile=args.tile)
    buf, out, figures = round_trip(dev, img, lambda: visemz.compress(img, **opts),
                                   lambda b: visemz.decompress(b, device=dev.name), args.repeats)
    tiles = container.unpack(buf).meta["tiles"]
    row = {"size": img.shape[0], "grid": tiles["grid"], "bytes": len(buf), "bpp": round(measure.bpp(len(buf), img.size), 4),
           "psnr": round(measure.psnr(img, out), 3), **figures}
    print(json.dumps(row), flush=True)
    return row, buf


def bench_untiled(dev: Device, images: list[np.ndarray], args) -> dict:
    """Format 3 (one tile) at doubling sizes until it fails: the rows it did and why it stopped."""
    rows, size, stop = [], 1024, None
    codec = visemz.ImageCodec(dev.name)
    opts = dict(model=args.model, quality=args.quality, image_format=3)
    while size <= args.untiled_max:
        img = mosaic(images, size)
        try:
            buf, _, figures = round_trip(dev, img, lambda: codec.compress(img, **opts), codec.decompress, args.repeats)
        except (torch.cuda.OutOfMemoryError, LimitExceededError, RuntimeError) as e:
            stop = f"{size}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            break
        finally:
            if dev.cuda:
                torch.cuda.empty_cache()
        row = {"size": size, **figures, "bytes": len(buf)}
        print(json.dumps({"untiled": row}), flush=True)
        rows.append(row)
        size *= 2
    return {"rows": rows, "largest": rows[-1]["size"] if rows else None, "stopped_at": stop}


def bench_kodak(dev: Device, kodak: list[np.ndarray], args) -> dict:
    """Per-pixel throughput on Kodak-size images (one tile each), uint16 as the mosaics."""
    enc, dec, px = [], [], 0
    for img in kodak:
        opts = dict(model=args.model, quality=args.quality, device=dev.name)
        t_enc, buf = dev.timed(lambda: visemz.compress(img, **opts), args.repeats)
        t_dec, _ = dev.timed(lambda: visemz.decompress(buf, device=dev.name), args.repeats)
        enc.append(t_enc)
        dec.append(t_dec)
        px += img.size
    return {"images": len(kodak), "compress_mpx_s": round(px / 1e6 / sum(enc), 2),
            "decompress_mpx_s": round(px / 1e6 / sum(dec), 2)}


def bench_region(dev: Device, buf: bytes, size: int, args) -> dict:
    side = min(1024, size // 2)
    y0 = x0 = max(0, size // 2 - side // 2 + 37)  # off the tile grid: it touches four tiles
    region = (y0, y0 + side, x0, x0 + side)
    t_region, part = dev.timed(lambda: visemz.decompress(buf, device=dev.name, region=region), args.repeats)
    t_full, full = dev.timed(lambda: visemz.decompress(buf, device=dev.name), max(1, args.repeats // 2))
    window = full[y0:y0 + side, x0:x0 + side]
    diff = np.abs(part.astype(np.float64) - window.astype(np.float64))
    row = {"size": size, "region": list(region), "region_s": round(t_region, 4), "full_s": round(t_full, 4),
           "speedup": round(t_full / t_region, 1), "region_equals_full_window": bool(np.array_equal(part, window)),
           # on the GPU the two run the network on tensors of other shapes (cuDNN may choose other algorithms)
           "max_abs_diff": float(diff.max()), "share_differing": round(float((diff > 0).mean()), 6)}
    print(json.dumps({"region": row}), flush=True)
    return row


def bench_seams(dev: Device, kodak: list[np.ndarray], args) -> dict:
    rows = []
    for q in args.qualities:
        d_psnr, d_bpp = [], []
        for img in kodak[: args.seam_images]:
            one = visemz.compress(img, model=args.model, quality=q, device=dev.name)
            tiled = visemz.compress(img, model=args.model, quality=q, device=dev.name, tile=args.seam_tile)
            p1 = measure.psnr(img, visemz.decompress(one, device=dev.name))
            pt = measure.psnr(img, visemz.decompress(tiled, device=dev.name))
            d_psnr.append(pt - p1)
            d_bpp.append(measure.bpp(len(tiled), img.size) - measure.bpp(len(one), img.size))
        row = {"quality": q, "tile": args.seam_tile, "images": len(d_psnr), "psnr_tiled_minus_untiled_db":
               round(statistics.mean(d_psnr), 4), "max_abs_psnr_diff_db": round(max(map(abs, d_psnr)), 4),
               "bpp_tiled_minus_untiled": round(statistics.mean(d_bpp), 4)}
        print(json.dumps({"seams": row}), flush=True)
        rows.append(row)
    return {"rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=SHARED / "xray", help="images the mosaics are built from")
    ap.add_argument("--kodak", type=Path, default=SHARED / "kodak")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="mbt2018-mean")
    ap.add_argument("--quality", type=float, default=4.0)
    ap.add_argument("--tile", type=int, default=DEFAULTS.tile)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--untiled-max", type=int, default=16384, help="largest size the untiled path is tried at")
    ap.add_argument("--kodak-images", type=int, default=24)
    ap.add_argument("--seam-images", type=int, default=8)
    ap.add_argument("--seam-tile", type=int, default=256)
    ap.add_argument("--qualities", type=float, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    # "codecs" named a part now in scripts/bench_zarr.py: still accepted, so recorded commands run as they were
    ap.add_argument("--skip", nargs="*", default=[], choices=["untiled", "kodak", "region", "seams", "codecs"])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    dev = Device(args.device)
    print(f"device: {dev.describe()} ({args.device}); tile {args.tile}, tile batch {DEFAULTS.tile_batch}", flush=True)
    images = sources(args.data)
    kodak = [gray16(load_image(p)) for p in sorted(args.kodak.glob("*.png"))[: args.kodak_images]]
    report = {"device": dev.describe(), "torch": torch.__version__, "tile": args.tile, "tile_batch": DEFAULTS.tile_batch,
              "model": args.model, "quality": args.quality, "data": str(args.data), "sizes": []}
    def save() -> None:  # after every part: a run cut off by the end of a GPU job keeps what it measured
        write_atomic(args.out, (json.dumps(report, indent=1) + "\n").encode())

    buf = None
    for size in args.sizes:
        row, buf = bench_size(dev, mosaic(images, size), args)
        report["sizes"].append(row)
        save()
    peaks = [r["compress_peak_mib"] for r in report["sizes"] if r["compress_peak_mib"] is not None]
    if peaks:
        report["compress_peak_spread"] = round(max(peaks) / min(peaks) - 1, 4)
    if "untiled" not in args.skip:
        report["untiled"] = bench_untiled(dev, images, args)
        save()
    if "kodak" not in args.skip and kodak:
        report["kodak"] = bench_kodak(dev, kodak, args)
        big = report["sizes"][-1]
        report["tiled_over_kodak_throughput"] = {
            k: round(big[k] / report["kodak"][k], 3) for k in ("compress_mpx_s", "decompress_mpx_s")}
        save()
    if "region" not in args.skip and buf is not None:
        report["region"] = bench_region(dev, buf, args.sizes[-1], args)
        save()
    if "seams" not in args.skip and kodak:
        report["seams"] = bench_seams(dev, kodak, args)
        save()
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
