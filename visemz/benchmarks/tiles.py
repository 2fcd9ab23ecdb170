"""Tiled compression on large 16-bit images: peak GPU memory, throughput, region reads, seams.

    python -m visemz.benchmarks.tiles --data DATA/eval/xray --kodak DATA/eval/kodak --out tiles.json
    python -m visemz.benchmarks.tiles --data DATA/eval/xray --kodak DATA/eval/kodak --sizes 256 512 --device cpu \
        --kodak-images 1 --qualities 1 8 --out t.json

For each size S of ``--sizes``: an S x S uint16 mosaic of the images under ``--data`` (gray; 8-bit
images scaled by 257; each placement flipped differently so no two neighbours repeat), compressed
tile by tile and decompressed, with the peak GPU memory of each (torch.cuda.max_memory_allocated
after a reset; also max_memory_reserved and what cupy's pool took: ``*_memory_mib``), the spread of
each peak over the sizes, where a decompress's memory goes (entropy decoding one tile against g_s on
one tile's window: ``decompress_parts_mib``, printed with the part that dominates) and Mpixel/s
(median of ``--repeats`` after a warm-up, synchronised).  Then:

- the untiled path (image format 3, one tile) at doubling sizes from 1024 until it fails (out of
  memory or a limit), the largest it did with its memory and throughput;
- per-pixel throughput on the Kodak images (``--kodak``), which fit one tile, and the ratio of the
  largest mosaic's tiled throughput to it;
- a 1024 x 1024 region of the largest mosaic's file (off the tile grid) against its full decode;
- seams: PSNR and bpp of tiled (``--seam-tile``) against untiled compression of Kodak images at each
  of ``--qualities``, and PSNR at equal bpp (the untiled curve read at the tiled bpp), BD-PSNR and
  BD-rate; ``--seams`` runs this part alone:

    python -m visemz.benchmarks.tiles --seams --data DATA/eval/xray --kodak DATA/eval/kodak --seam-tile 256 \\
        --out seams.json

- the folder pipeline (``compress_folder``, configured as ``visemz compress`` configures it): for each
  of ``--pipeline-sizes``, ``--pipeline-images`` mosaics written as uint16 TIFF files into a scratch folder
  (``--work``, kept; else a temporary one, removed), compressed with 1 lane and with each of ``--lanes``
  (warm-up run with its peak GPU memory, then the median of ``--repeats``), in Mpx/s and images/s with the
  bytes and bpp; the same for the Kodak images (gray uint16 TIFF, linked as often as it takes to reach the
  largest size's pixel count) through the same pipeline and lanes; each lane count over one lane (do lanes
  overlap tiles?) and the mosaics' per-pixel rate over Kodak's (at least 0.9?); ``--pipeline`` runs this
  part alone:

    python -m visemz.benchmarks.tiles --pipeline --pipeline-images 8 --pipeline-sizes 8192 --lanes 4 --out pipe.json

visemz against JPEG 2000 and JPEG XL on chunks of such a mosaic, through Zarr: ``visemz.benchmarks.zarr_chunks``.

Prints the device and writes everything as JSON to ``--out`` (atomically).  Data never ships with the repo.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np
import tifffile
import torch
from scipy.interpolate import PchipInterpolator

import visemz
from visemz import container, defaults, measure
from visemz.benchmarks.common import Device, converted_folder, gray16, mosaic, sources
from visemz.errors import LimitExceededError
from visemz.evaluation.bjontegaard import BDError, bd_psnr, bd_rate
from visemz.image.codec import network_math
from visemz.io import files
from visemz.io.loaders import load_image
from visemz.io.writers import write_atomic
from visemz.models import architectures
from visemz.pipeline.jobs import CompressConfig, compress_folder


def round_trip(dev: Device, img: np.ndarray, compress, decompress, repeats: int) -> tuple[bytes, np.ndarray, dict]:
    """Peak memory of one compress and one decompress, then their median times: (file, image, figures)."""
    buf, enc_mem = dev.memory(compress)
    _, dec_mem = dev.memory(lambda: decompress(buf))
    t_enc, _ = dev.timed(compress, repeats)
    t_dec, out = dev.timed(lambda: decompress(buf), repeats)
    mpx = img.size / 1e6
    return buf, out, {"compress_s": round(t_enc, 4), "decompress_s": round(t_dec, 4),
                      "compress_mpx_s": round(mpx / t_enc, 2), "decompress_mpx_s": round(mpx / t_dec, 2),
                      "compress_peak_mib": enc_mem and enc_mem["allocated_peak"],
                      "decompress_peak_mib": dec_mem and dec_mem["allocated_peak"],
                      "compress_memory_mib": enc_mem, "decompress_memory_mib": dec_mem}


def decompress_parts(dev: Device, buf: bytes) -> dict | None:
    """Where a tiled decompress's GPU memory goes (MiB, torch's allocator, peaks above what it held before):
    entropy decoding and dequantising the tile with the largest synthesis window, g_s on that window (its
    halo included, as the decode runs it), and the whole decompress; which of the two parts is the larger.
    The parts run apart, so the whole can exceed the larger by what the decode holds beside it (the
    window's latent, the tile's pixels on their way to the host)."""
    if not dev.cuda:
        return None
    codec = visemz.ImageCodec(dev.name)
    f = codec._open(buf)  # the decoder's own opened file: its grid, networks and per-tile symbol decoding
    tile = max(range(f.grid.count), key=lambda i: _window_area(f.grid, i))
    (y0, y1, x0, x1), _ = f.grid.synthesis_window(tile)
    with network_math():
        latent, entropy = dev.memory(
            lambda: architectures.dequantise(f.net, f.symbols(tile), f.header["quality"], torch.float32))
        window = torch.zeros((latent.shape[0], latent.shape[1], y1 - y0, x1 - x0), device=latent.device)
        del latent
        _, synthesis = dev.memory(lambda: f.net.g_s(window))
        window = None  # free it now (not del: the lambda above names it)
        _, whole = dev.memory(lambda: codec.decompress(buf))
    parts = {"entropy_decode_tile": entropy["allocated_peak"] - entropy["before"],
             "g_s_tile_window": synthesis["allocated_peak"] - synthesis["before"],
             "decompress": whole["allocated_peak"] - whole["before"]}
    part = max(("entropy_decode_tile", "g_s_tile_window"), key=parts.get)
    return {"tile": tile, "window_latent": [y1 - y0, x1 - x0], **{k: round(v, 1) for k, v in parts.items()},
            "held_before_mib": whole["before"], "cupy_pool_mib": whole["cupy_pool"], "dominant": part,
            "dominant_share_of_decompress": round(parts[part] / parts["decompress"], 3)}


def _window_area(grid, i: int) -> int:
    (y0, y1, x0, x1), _ = grid.synthesis_window(i)
    return (y1 - y0) * (x1 - x0)


def bench_size(dev: Device, img: np.ndarray, args) -> tuple[dict, bytes]:
    opts = dict(model=args.model, quality=args.quality, device=dev.name, tile=args.tile)
    buf, out, figures = round_trip(dev, img, lambda: visemz.compress(img, **opts),
                                   lambda b: visemz.decompress(b, device=dev.name), args.repeats)
    tiles = container.unpack(buf).meta["tiles"]
    row = {"size": img.shape[0], "grid": tiles["grid"], "bytes": len(buf),
           "bpp": round(measure.bpp(len(buf), img.size), 4), "psnr": round(measure.psnr(img, out), 3), **figures}
    parts = decompress_parts(dev, buf)
    if parts is not None:
        row["decompress_parts_mib"] = parts
    print(json.dumps(row), flush=True)
    if parts is not None:
        print(f"  decompress of {img.shape[0]}: {parts['decompress']} MiB above the {parts['held_before_mib']} MiB "
              f"held before; g_s on one tile window {parts['g_s_tile_window']} MiB, entropy decoding one tile "
              f"{parts['entropy_decode_tile']} MiB: {parts['dominant']} dominates "
              f"({parts['dominant_share_of_decompress']:.0%} of it)", flush=True)
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


# ------------------------------------------------------------------ large images through the folder pipeline
def pipeline_folders(images: list[np.ndarray], kodak: list[np.ndarray], args, work: Path) -> tuple[dict, Path]:
    """The pipeline part's source folders under ``work``: for each size, ``--pipeline-images`` uint16 mosaics
    as TIFF files (mosaic k from the sources rotated by k, so neighbouring files differ), and the Kodak images
    (gray uint16 TIFF) linked as many times as it takes to reach the largest size's total pixel count."""
    folders = {}
    for size in args.pipeline_sizes:
        folder = work / f"mosaics-{size}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for k in range(args.pipeline_images):  # one at a time: K large mosaics need not fit in memory together
            turn = k % len(images)
            tifffile.imwrite(folder / f"mosaic{k}.tif", mosaic(images[turn:] + images[:turn], size))
        folders[size] = folder
    target = args.pipeline_images * max(args.pipeline_sizes) ** 2
    copies = math.ceil(target / sum(img.size for img in kodak))
    named = [(f"kodak{i:02d}", img) for i, img in enumerate(kodak)]
    return folders, converted_folder(named, work / "kodak", copies, ".tif", tifffile.imwrite)


def pipeline_run(dev: Device, src: Path, dst: Path, lanes: int, args) -> dict:
    """The folder ``src`` compressed into ``dst`` by ``compress_folder`` with ``lanes`` lanes, as the CLI
    configures it: a warm-up run (the lanes' first use; its peak GPU memory is the row's), then the median of
    ``--repeats`` synchronised runs, each into an emptied ``dst``; the last run's files stay in ``dst``."""
    cfg = CompressConfig(model=args.model, quality=args.quality, device=dev.name, streams=lanes, resume=False,
                         tile=args.tile)
    clear = lambda: shutil.rmtree(dst, ignore_errors=True)
    run = lambda: _all_done(compress_folder(src, dst, cfg))
    clear()
    _, memory = dev.memory(run)
    seconds, summary = measure.median_seconds(run, args.repeats, sync=dev.sync, reset=clear)
    s, pixels = summary.to_dict(), sum(r.pixels for r in summary.results)
    return {"lanes": lanes, "images": s["done"], "pixels": pixels, "seconds": round(seconds, 4),
            "mpx_s": round(pixels / 1e6 / seconds, 2),
            "images_per_s": round(s["done"] / seconds, 3), "bytes": s["bytes_out"], "bpp": s["bpp"],
            "loaders": s["loaders"], "compress_peak_mib": memory and memory["allocated_peak"], "memory_mib": memory}


def _all_done(summary):
    """A run whose every item was compressed; a failed item makes the figures meaningless: raise."""
    if summary.failed:
        raise RuntimeError(f"the folder pipeline failed items: {summary.to_dict()['errors'][:3]}")
    return summary


def decoded_check(dev: Device, src: Path, dst: Path) -> dict:
    """The first output of ``dst`` decoded against its source: shape, dtype and PSNR (untimed)."""
    out = sorted(dst.rglob("*" + files.SUFFIX))[0]
    source = tifffile.imread(src / out.relative_to(dst).as_posix()[: -len(files.SUFFIX)])
    img = visemz.decompress(out.read_bytes(), device=dev.name)
    return {"file": out.relative_to(dst).as_posix(), "shape": list(img.shape), "dtype": str(img.dtype),
            "matches_source_shape": img.shape == source.shape and img.dtype == source.dtype,
            "psnr": round(measure.psnr(source, img), 3)}


def bench_pipeline(dev: Device, images: list[np.ndarray], kodak: list[np.ndarray], args, part: dict, save) -> None:
    """Large tiled images through the folder pipeline's lanes (1 lane and each of ``--lanes``) against
    Kodak-size images (one tile each) through the same pipeline and lanes, per pixel.  The mosaics run
    first, so a run cut off in the Kodak folder keeps them; ``part`` is filled and ``save()`` called after
    each folder.  Scratch files go under ``--work`` (kept) or a temporary folder (removed)."""
    lanes = sorted({1, *args.lanes})
    temp = args.work is None
    work = Path(tempfile.mkdtemp(prefix="bench_tiles_pipeline_")) if temp else args.work / "pipeline"
    try:
        folders, kodak_src = pipeline_folders(images, kodak, args, work)
        part.update({"lanes": lanes, "images": args.pipeline_images, "sizes": [], "work": None if temp else str(work)})
        # the weights on the device before any run, so that every run's memory "before" holds them
        visemz.compress(kodak[0], model=args.model, quality=args.quality, device=dev.name)
        for size, folder in folders.items():
            runs = [pipeline_run(dev, folder, work / "out" / f"{size}-{n}", n, args) for n in lanes]
            first = work / "out" / f"{size}-1" / ("mosaic0.tif" + files.SUFFIX)
            row = {"size": size, "grid": container.unpack(first.read_bytes()).meta["tiles"]["grid"], "runs": runs,
                   **_lane_ratios(runs), "decoded": decoded_check(dev, folder, work / "out" / f"{size}-{lanes[-1]}")}
            part["sizes"].append(row)
            print(json.dumps({"pipeline": row}), flush=True)
            save()
        runs = [pipeline_run(dev, kodak_src, work / "out" / f"kodak-{n}", n, args) for n in lanes]
        part["kodak"] = {"distinct": len(kodak), "runs": runs, **_lane_ratios(runs),
                         "decoded": decoded_check(dev, kodak_src, work / "out" / f"kodak-{lanes[-1]}")}
        print(json.dumps({"pipeline_kodak": part["kodak"]}), flush=True)
        for row in part["sizes"]:
            over = {str(a["lanes"]): round(_rate(a) / _rate(b), 3) for a, b in zip(row["runs"], runs)}
            row["over_kodak_per_pixel"] = over
            row["at_least_0_9_of_kodak"] = {n: r >= 0.9 for n, r in over.items()}
            print(f"{row['size']}x{row['size']} x {args.pipeline_images} through the pipeline: " + ", ".join(
                f"{r['lanes']} lane(s) {r['mpx_s']} Mpx/s ({over[str(r['lanes'])]:.0%} of Kodak's per pixel)"
                for r in row["runs"]) + f"; over one lane {row['lanes_over_one_lane']} (Kodak's "
                f"{part['kodak']['lanes_over_one_lane']})", flush=True)
        save()
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)


def _lane_ratios(runs: list[dict]) -> dict:
    """Each lane count's throughput over one lane's, and whether the lanes overlap: the best of them more
    than 5% (beyond run-to-run spread) faster than one lane.  On a GPU also each lane count's peak memory
    above what was held before (the weights) over one lane's: near N when N lanes hold their tiles at once."""
    ratios = {str(r["lanes"]): round(_rate(r) / _rate(runs[0]), 3) for r in runs[1:]}
    out = {"lanes_over_one_lane": ratios, "lanes_overlap": bool(ratios) and max(ratios.values()) > 1.05}
    if runs[0]["memory_mib"] is not None:
        working = [r["memory_mib"]["allocated_peak"] - r["memory_mib"]["before"] for r in runs]
        out["working_memory_over_one_lane"] = {str(r["lanes"]): round(w / working[0], 2)
                                               for r, w in zip(runs[1:], working[1:])}
    return out


def _rate(run: dict) -> float:
    """Pixels per second of a pipeline run, unrounded."""
    return run["pixels"] / run["seconds"]


def bench_seams(dev: Device, kodak: list[np.ndarray], args) -> dict:
    """Tiled (``--seam-tile``) against untiled (one tile) files of the Kodak images at each quality: PSNR
    and bpp at the same quality, and PSNR at equal bpp (the untiled curve of the image, PCHIP in log bpp
    over ``--qualities``, read at the tiled file's bpp; None where that bpp lies beyond the curve), whose
    mean the aim holds within 0.05 dB; BD-PSNR and BD-rate of tiled against untiled per image."""
    images = kodak[: args.seam_images]
    points = []  # per image: {quality: (untiled bpp, psnr, tiled bpp, psnr)}
    for img in images:
        curve = {}
        for q in args.qualities:
            one = visemz.compress(img, model=args.model, quality=q, device=dev.name)
            tiled = visemz.compress(img, model=args.model, quality=q, device=dev.name, tile=args.seam_tile)
            curve[q] = (measure.bpp(len(one), img.size), measure.psnr(img, visemz.decompress(one, device=dev.name)),
                        measure.bpp(len(tiled), img.size), measure.psnr(img, visemz.decompress(tiled, device=dev.name)))
        points.append(curve)
    rows = [_seam_row(q, points, args.seam_tile) for q in args.qualities]
    for row in rows:
        print(json.dumps({"seams": row}), flush=True)
    out = {"tile": args.seam_tile, "images": len(images),
           "shapes": sorted({f"{i.shape[0]}x{i.shape[1]}" for i in images}), "rows": rows}
    bd = [_bd(p) for p in points]
    bd = [b for b in bd if b is not None]
    out["bd_psnr_db"] = round(statistics.mean(b for b, _ in bd), 4) if bd else None
    out["bd_rate_percent"] = round(statistics.mean(r for _, r in bd), 3) if bd else None
    out["images_with_bd"] = len(bd)
    equal = [r["psnr_diff_at_equal_bpp_db"] for r in rows if r["psnr_diff_at_equal_bpp_db"] is not None]
    out["max_abs_psnr_diff_at_equal_bpp_db"] = round(max(map(abs, equal)), 4) if equal else None
    out["within_0_05_db"] = bool(equal) and out["max_abs_psnr_diff_at_equal_bpp_db"] <= 0.05
    print(json.dumps({"seams_summary": {k: v for k, v in out.items() if k != "rows"}}), flush=True)
    return out


def _bd(curve: dict) -> tuple[float, float] | None:
    """(BD-PSNR dB, BD-rate %) of an image's tiled curve against its untiled one; None where the curves
    allow none (fewer than two qualities, a curve not increasing, no shared interval)."""
    try:
        return bd_psnr(*_curves(curve)), bd_rate(*_curves(curve))
    except BDError:
        return None


def _curves(curve: dict) -> tuple[list, list, list, list]:
    """(untiled bpp, untiled PSNR, tiled bpp, tiled PSNR) over the qualities, as bjontegaard takes them."""
    cols = list(zip(*curve.values()))
    return list(cols[0]), list(cols[1]), list(cols[2]), list(cols[3])


def _seam_row(q: float, points: list[dict], tile: int) -> dict:
    d_psnr = [p[q][3] - p[q][1] for p in points]
    d_bpp = [p[q][2] - p[q][0] for p in points]
    at_equal = [d for d in (_psnr_at_equal_bpp(p, q) for p in points) if d is not None]
    return {"quality": q, "tile": tile, "images": len(points),
            "bpp_untiled": round(statistics.mean(p[q][0] for p in points), 4),
            "bpp_tiled": round(statistics.mean(p[q][2] for p in points), 4),
            "psnr_untiled": round(statistics.mean(p[q][1] for p in points), 4),
            "psnr_tiled": round(statistics.mean(p[q][3] for p in points), 4),
            "psnr_tiled_minus_untiled_db": round(statistics.mean(d_psnr), 4),
            "max_abs_psnr_diff_db": round(max(map(abs, d_psnr)), 4),
            "bpp_tiled_minus_untiled": round(statistics.mean(d_bpp), 4),
            "bpp_tiled_over_untiled": round(statistics.mean(p[q][2] / p[q][0] for p in points), 4),
            "psnr_diff_at_equal_bpp_db": round(statistics.mean(at_equal), 4) if at_equal else None,
            "images_at_equal_bpp": len(at_equal)}


def _psnr_at_equal_bpp(curve: dict, q: float) -> float | None:
    """Tiled PSNR at quality q minus the untiled curve's PSNR at the tiled bpp (PCHIP in log bpp), or None
    where the tiled bpp lies outside the untiled curve (or the curve is not increasing)."""
    bpp, psnr = (np.array(v) for v in _curves(curve)[:2])
    order = np.argsort(bpp)
    bpp, psnr = bpp[order], psnr[order]
    x = curve[q][2]
    if len(bpp) < 2 or np.any(np.diff(bpp) <= 0) or np.any(np.diff(psnr) <= 0) or not bpp[0] <= x <= bpp[-1]:
        return None
    return float(curve[q][3] - PchipInterpolator(np.log10(bpp), psnr)(np.log10(x)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="images the mosaics are built from, e.g. DATA/eval/xray")
    ap.add_argument("--kodak", type=Path, required=True, help="the Kodak images (PNG), e.g. DATA/eval/kodak")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="mbt2018-mean")
    ap.add_argument("--quality", type=float, default=4.0)
    ap.add_argument("--tile", type=int, default=defaults.get("tile"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--untiled-max", type=int, default=16384, help="largest size the untiled path is tried at")
    ap.add_argument("--kodak-images", type=int, default=24)
    ap.add_argument("--seam-images", type=int, default=8)
    ap.add_argument("--seam-tile", type=int, default=256)
    ap.add_argument("--qualities", type=float, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    # "codecs" named a part now in visemz.benchmarks.zarr_chunks: still accepted, so recorded commands run as they were
    ap.add_argument("--pipeline-sizes", type=int, nargs="+", default=[8192], help="mosaic sizes of the pipeline part")
    ap.add_argument("--pipeline-images", type=int, default=8, help="mosaics per size in the pipeline part's folder")
    ap.add_argument("--lanes", type=int, nargs="+", default=[4], help="lane counts the pipeline part compares with 1")
    ap.add_argument("--work", type=Path, default=None, help="the pipeline part's scratch folder (kept; default: "
                                                            "a temporary one, removed)")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["untiled", "kodak", "region", "seams", "pipeline", "codecs"])
    ap.add_argument("--seams", action="store_true",
                    help="only the seams part (tiles of --seam-tile on the Kodak images)")
    ap.add_argument("--pipeline", action="store_true",
                    help="only the pipeline part (mosaics and Kodak through the lanes)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.seams and args.pipeline:
        ap.error("--seams and --pipeline each run one part alone: give one of them")
    if args.pipeline_images < 1 or min(args.lanes) < 1 or min(args.pipeline_sizes) < 1:
        ap.error("--pipeline-images, --lanes and --pipeline-sizes must be positive")
    if args.seams:
        args.sizes, args.skip = [], ["untiled", "kodak", "region", "pipeline"]
    if args.pipeline:
        args.sizes, args.skip = [], ["untiled", "kodak", "region", "seams"]
    dev = Device(args.device)
    tile_batch = defaults.get("tile_batch")
    print(f"device: {dev.describe()} ({args.device}); tile {args.tile}, tile batch {tile_batch}", flush=True)
    images = sources(args.data) if args.sizes or "pipeline" not in args.skip else []
    kodak = [gray16(load_image(p)) for p in sorted(args.kodak.glob("*.png"))[: args.kodak_images]]
    if args.pipeline and not kodak:
        raise SystemExit(f"no PNG images under --kodak {args.kodak}: the pipeline part compares with them")
    report = {"device": dev.describe(), "torch": torch.__version__, "tile": args.tile,
              "tile_batch": tile_batch, "model": args.model, "quality": args.quality, "data": str(args.data),
              "sizes": []}
    def save() -> None:  # after every part: a run cut off by the end of a GPU job keeps what it measured
        write_atomic(args.out, (json.dumps(report, indent=1) + "\n").encode())

    buf = None
    for size in args.sizes:
        row, buf = bench_size(dev, mosaic(images, size), args)
        report["sizes"].append(row)
        save()
    for part in ("compress", "decompress"):  # the largest size's peak over the smallest's (the aim: within 10%)
        peaks = [r[f"{part}_peak_mib"] for r in report["sizes"] if r[f"{part}_peak_mib"] is not None]
        if peaks:
            report[f"{part}_peak_spread"] = round(max(peaks) / min(peaks) - 1, 4)
            print(f"{part} peak {min(peaks)}..{max(peaks)} MiB over the sizes: spread "
                  f"{report[f'{part}_peak_spread']:.1%}",
                  flush=True)
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
    if "pipeline" not in args.skip and kodak:
        report["pipeline"] = {}
        bench_pipeline(dev, images, kodak, args, report["pipeline"], save)
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
