"""Folder-compression throughput on a GPU: visemz (one and several streams) against CompressAI's
compress() loop with the same weights and against nvJPEG behind the same loader.

    python -m visemz.benchmarks.pipeline --data DATA/eval --repeat-to 500 --out bench_pipeline.json
    python -m visemz.benchmarks.pipeline ... --quick            # one repeat, one multi-stream setting
    python -m visemz.benchmarks.pipeline ... --max-error 0      # lossless (or near-lossless) folders
    torchrun --nproc-per-node 2 -m visemz.benchmarks.pipeline --torchrun --data ... --out bench_2gpu.json

The folder is built under --work from every image under --data, repeated (hard links, else
copies) until it holds at least --repeat-to files, so its mix of sizes is the source set's.
Every run compresses the whole folder from files to files (load, compress, atomic write):

  (a) CompressAI's compress() per image, same weights, on the distinct images (the same mix), written as the
      evaluation's ``compressai-<arch>`` codec writes it (a decodable stream);
  (b) visemz with one stream; (c) visemz with --streams N each (loader auto: DALI when present);
  (d) nvJPEG (torchvision.io.encode_jpeg on CUDA tensors) in the same executor behind the same
      loader, at the JPEG quality whose mean PSNR first reaches visemz's (bisection on the
      distinct images; gray images are encoded as 3 equal channels: nvJPEG takes RGB only);
  loaders: DALI against the CPU loader (PNG), kvikio against the CPU loader (.npy copies);
  decompression (to .npy, kvikio writer when present) for (b) and (c).

Each compress row says how many ints-stream calls shared an nvCOMP launch on average (the grouped
entropy stage; run again with VISEMZ_ENTROPY_BATCH=0 for one launch per stream).

With --max-error E every visemz run codes with that bound and (a) and (d) are left out: they compare lossy
files at matched quality.  Each setting is warmed up on the distinct images first; times are medians of
--repeat runs with torch.cuda.synchronize() around each.  Every (c) run's files must be byte for byte
(b)'s (``same_bytes_as_one_stream``): a run that writes other bytes fails the benchmark after its report is
written, since its rate would be a corrupt job's.  images/s counts files, MB/s the decoded input
bytes, bpp is bits per pixel of the outputs, Mpx/s the images' pixels (megapixels) a second, PSNR (dB) is
the mean over the distinct images (null where they decode exactly) beside their largest error.  Ratios
compare settings measured in the same run.  The device name is printed and stored in the JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.distributed as dist
from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

from visemz import defaults, markdown, measure
from visemz.benchmarks.common import converted_folder, link_or_copy
from visemz.encoders import gpu
from visemz.errors import InvalidArgumentError
from visemz.evaluation.codecs import Layout
from visemz.evaluation.codecs.learned import CompressAIRans
from visemz.io import files, loaders, writers
from visemz.pipeline import executor, kvikio_io, sources
from visemz.pipeline.jobs import (
    CompressConfig,
    DecompressConfig,
    compress_folder,
    decompress_folder,
    verify,
)
from visemz.pipeline.results import ItemResult, Summary


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder of source images (recursive), e.g. DATA/eval")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--out", type=Path, default=Path("bench_pipeline.json"))
    ap.add_argument("--repeat-to", type=int, default=None,
                    help="files in the folder at least (default 500, --quick 200)")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per setting (default 3, --quick 1)")
    ap.add_argument("--streams", type=_int_list, default=None, help="multi-stream settings, e.g. 2,4,8 (--quick: 4)")
    ap.add_argument("--model", default="balle2016")
    ap.add_argument("--quality", type=float, default=4.0)
    ap.add_argument("--max-error", type=float, default=None,
                    help="code every image with this bound (0: lossless), in the images' own levels")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--loader", default="auto", help="loader of the visemz and nvJPEG runs (auto, dali, kvikio, cpu)")
    ap.add_argument("--quick", action="store_true", help="one repeat, one multi-stream setting, 8-image subsets")
    ap.add_argument("--no-dali", action="store_true", help="skip DALI (also for the main runs)")
    ap.add_argument("--no-kvikio", action="store_true", help="skip the kvikio comparison")
    ap.add_argument("--no-compressai", action="store_true")
    ap.add_argument("--no-jpeg", action="store_true")
    ap.add_argument("--torchrun", action="store_true", help="under torchrun: one GPU against all of them")
    args = ap.parse_args(argv)
    args.repeat_to = (200 if args.quick else 500) if args.repeat_to is None else args.repeat_to
    args.repeat = (1 if args.quick else 3) if args.repeat is None else args.repeat
    args.streams = ([4] if args.quick else [2, 4, 8]) if args.streams is None else args.streams
    if args.no_dali and args.loader in ("auto", "dali"):
        args.loader = "cpu"  # the source folder holds image files: without DALI the CPU loader reads them
    if args.repeat_to < 1 or args.repeat < 1 or not args.streams or min(args.streams) < 1:
        ap.error("--repeat-to, --repeat and --streams must be positive")
    if args.torchrun and args.work is None:
        ap.error("--torchrun needs --work: a folder every rank sees")
    if args.max_error is not None:
        if args.max_error < 0:
            ap.error(f"--max-error {args.max_error}: a bound is 0 or more")
        args.no_compressai = args.no_jpeg = True  # their rows match lossy files' quality
    return args


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ the folder
@dataclass
class Folder:
    distinct: Path  # one copy of every source image
    src: Path  # the repeated folder
    npy: Path | None  # the repeated folder as .npy files (kvikio comparison)
    images: list  # (relative path, pixels) of the distinct images
    files: int


def build_folder(data: Path, work: Path, repeat_to: int, with_npy: bool) -> Folder:
    originals = files.discover(data, files.IMAGE_EXTENSIONS)
    if not originals:
        raise InvalidArgumentError(f"no images under {str(data)!r}")
    rels = [p.relative_to(data).as_posix() if data.is_dir() else p.name for p in originals]
    copies = math.ceil(repeat_to / len(originals))
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    for r in range(copies):
        for p, rel in zip(originals, rels):
            link_or_copy(p if r == 0 else src / "rep000" / rel, src / f"rep{r:03d}" / rel)
    images = [(rel, loaders.load(src / "rep000" / rel).pixels) for rel in rels]
    npy = converted_folder(images, work / "npy", copies, ".npy", np.save) if with_npy else None
    return Folder(src / "rep000", src, npy, images, copies * len(originals))


def save_jpeg(path: Path, img: np.ndarray) -> None:
    """8-bit JPEG at quality 95 (what a microscope or camera folder of JPEGs looks like)."""
    pixels = img if img.dtype == np.uint8 else \
        (img.astype(np.float64) * 255 / max(float(img.max()), 1)).astype(np.uint8)
    if pixels.ndim == 3:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    if not cv2.imwrite(str(path), pixels, [cv2.IMWRITE_JPEG_QUALITY, 95]):
        raise RuntimeError(f"OpenCV could not write {path}")


# ------------------------------------------------------------------ timing
def timed(run, reset, repeat: int, device: str) -> tuple[float, Summary]:
    """Median seconds of run() over ``repeat`` runs, reset() (untimed) before each."""
    return measure.median_seconds(run, repeat, sync=lambda: sync(device), reset=reset)


def row(label: str, seconds: float, summary: Summary, decoded: str = "bytes_in", **extra) -> dict:
    """One line of results; MB/s counts decoded image bytes (``bytes_out`` for decompression)."""
    d = summary.to_dict()
    pixels = sum(r.pixels for r in summary.results if r.status == "done")
    r = {"label": label, "seconds": round(seconds, 4), "files": d["items"], "done": d["done"], "failed": d["failed"],
         "images_per_s": round(d["done"] / seconds, 2), "MB_per_s": round(d[decoded] / 1e6 / seconds, 2),
         "Mpx_per_s": round(pixels / 1e6 / seconds, 2),
         "bpp": d["bpp"] if decoded == "bytes_in" else None, "loaders": d["loaders"], "fallbacks": len(d["fallbacks"]),
         **extra}
    if d["errors"]:
        r["first_error"] = d["errors"][0]
    print(json.dumps(r), flush=True)
    return r


def slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


def compress_row(label: str, src: Path, distinct: Path, out: Path, cfg: CompressConfig,
                 repeat: int) -> tuple[dict, Path]:
    """Compress the repeated folder ``src`` (after a warm-up on ``distinct``, kept in out/warm-<label>)."""
    dst = out / slug(label)
    compress_folder(distinct, out / f"warm-{slug(label)}", cfg)  # warm-up: weights, kernels, streams' workspaces
    before = launches()
    seconds, summary = timed(lambda: compress_folder(src, dst, cfg), lambda: shutil.rmtree(dst, ignore_errors=True),
                             repeat, _device(cfg.device))
    n, calls = (a - b for a, b in zip(launches(), before))
    return row(label, seconds, summary, streams=cfg.streams, loader=cfg.loader,
               calls_per_nvcomp_launch=round(calls / n, 2) if n else None), dst


def vsz_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every .vsz file under ``folder``, by its relative path."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.vsz"))}


def differing_runs(report: dict) -> list[str]:
    """The labels of runs whose files are not the one-stream run's."""
    return [r["label"] for r in report["runs"] if r.get("same_bytes_as_one_stream") is False]


def launches() -> tuple[int, int]:
    """(grouped nvCOMP launches, ints-stream calls they served) so far in this process (encoders/grouping.py)."""
    counts = gpu.group_counts().values()
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def decompress_row(label: str, compressed: Path, out: Path, cfg: DecompressConfig, repeat: int) -> dict:
    dst = out / slug(label)
    decompress_folder(compressed / "rep000", out / f"warm-{slug(label)}", cfg)
    seconds, summary = timed(lambda: decompress_folder(compressed, dst, cfg),
                             lambda: shutil.rmtree(dst, ignore_errors=True), repeat, _device(cfg.device))
    return row(label, seconds, summary, "bytes_out", streams=cfg.streams, format=cfg.fmt, writer=cfg.writer)


def _device(device) -> str:
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


# ------------------------------------------------------------------ nvJPEG behind the same loader
def _rgb_chw(x) -> torch.Tensor:
    """An 8-bit HxW or HxWx3 image -> a contiguous 3xHxW uint8 tensor (gray replicated)."""
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    if t.dtype != torch.uint8 or not (t.dim() == 2 or (t.dim() == 3 and t.shape[2] == 3)):
        raise InvalidArgumentError(f"nvJPEG takes 8-bit gray or RGB images, not {tuple(t.shape)} {t.dtype}")
    return (t[None].expand(3, -1, -1) if t.dim() == 2 else t.permute(2, 0, 1)).contiguous()


def jpeg_bytes(images: list, quality: int) -> list[bytes]:
    return [d.cpu().numpy().tobytes() for d in encode_jpeg(images, quality=quality)]


def jpeg_folder(src: Path, dst: Path, quality: int, device: str, streams: int, loader: str) -> Summary:
    """The JPEG baseline through visemz's own executor and loaders: same feeding, another codec."""
    items = files.plan(src, dst, files.discover(src, files.IMAGE_EXTENSIONS), lambda rel: rel + ".jpg")
    plan = sources.installed_plan(loader, device)
    index = torch.cuda.current_device() if device == "cuda" else None

    def compute(lane, i, pic):
        pixels = lane.to_device(pic.pixels)
        data = jpeg_bytes([_rgb_chw(pixels)], quality)[0]
        lane.finish()
        return data, pic.nbytes, int(np.prod(pic.pixels.shape[:2])), pic.loader

    def write(i, out):
        data, nbytes, pixels, loader = out
        writers.write_atomic(items[i].dst, data)
        return ItemResult(items[i].rel, "done", nbytes, len(data), pixels, loader=loader)

    lanes, depth = executor.resolve(executor.ExecutorConfig(streams), device)
    t0 = time.perf_counter()
    results = executor.run([it.rel for it in items], sources.feeds(items, plan, index), compute, write,
                           executor.make_lanes(device, lanes), depth)
    return Summary(results, time.perf_counter() - t0)


def jpeg_quality_for(images: list, target_psnr: float, device: str) -> tuple[int, float, float]:
    """Smallest JPEG quality whose mean PSNR over ``images`` reaches ``target_psnr``: (q, psnr, bpp)."""
    dev = [_rgb_chw(img).to(device) for _, img in images]
    pixels = sum(img.shape[0] * img.shape[1] for _, img in images)

    def score(q: int) -> tuple[float, float]:
        data = jpeg_bytes(dev, q)
        scores = []
        for (_, img), d in zip(images, data):
            mode = ImageReadMode.GRAY if img.ndim == 2 else ImageReadMode.RGB
            rec = decode_jpeg(torch.frombuffer(bytearray(d), dtype=torch.uint8), mode=mode).permute(1, 2, 0).numpy()
            scores.append(measure.psnr(img, rec[..., 0] if img.ndim == 2 else rec))
        return float(np.mean(scores)), 8 * sum(len(d) for d in data) / pixels

    lo, hi = 1, 100
    while lo < hi:  # PSNR grows with quality: find the first quality that reaches the target
        mid = (lo + hi) // 2
        if score(mid)[0] >= target_psnr:
            hi = mid
        else:
            lo = mid + 1
    return (lo, *score(lo))


# ------------------------------------------------------------------ CompressAI's own loop
def compressai_row(images: list, distinct: Path, out: Path, model: str, quality: float, device: str,
                   repeat: int) -> dict:
    codec = CompressAIRans(model, device)  # CompressAI's compress() with visemz's weights
    dst = out / "compressai"

    def run():
        results = []
        for rel, _ in images:
            img = loaders.load(distinct / rel).pixels  # the same file-to-file work as the pipeline's
            data = codec.encode(img, quality)
            writers.write_atomic(dst / (rel + ".cai"), data)
            results.append(ItemResult(rel, "done", img.nbytes, len(data), int(np.prod(img.shape[:2]))))
        return Summary(results, 0.0)

    run()  # warm-up: both models loaded, their CDF tables built
    seconds, summary = timed(run, lambda: shutil.rmtree(dst, ignore_errors=True), repeat, device)
    scores = []
    for rel, img in images:  # reconstruction quality of the last run's files, untimed
        rec = codec.decode((dst / (rel + ".cai")).read_bytes(), quality, Layout.of(img))
        scores.append(measure.psnr(img, rec))
    return row("a: compressai-loop", seconds, summary, psnr=round(float(np.mean(scores)), 3), images=len(images))


# ------------------------------------------------------------------ the runs
def subset(images: list, n: int | None) -> list:
    """At most n images spread over the sorted list, so a subset keeps the set's mix."""
    if n is None or len(images) <= n:
        return images
    return [images[int(k)] for k in np.linspace(0, len(images) - 1, n).round()]


def quality_of(images: list, per_file: dict) -> tuple[float | None, float, float]:
    """visemz's mean PSNR (None where an image decodes exactly), bpp and largest error over ``images`` from
    verify()'s rows."""
    rows = [per_file[rel] for rel, _ in images]
    bad = [r for r in rows if "psnr" not in r]
    if bad:
        raise RuntimeError(f"visemz outputs failed to verify: {bad[:3]}")
    pixels = sum(img.shape[0] * img.shape[1] for _, img in images)
    psnr = float(np.mean([float(r["psnr"]) for r in rows]))  # verify() writes an exact image's as "inf"
    return (psnr if math.isfinite(psnr) else None), 8 * sum(r["bytes"] for r in rows) / pixels, \
        max(float(r["max_error"]) for r in rows)


def single_gpu(args, work: Path) -> dict:
    device = args.device
    plan = sources.installed_plan("auto", device)
    folder = build_folder(args.data, work, args.repeat_to, with_npy=plan.kvikio and not args.no_kvikio)
    out = work / "out"
    report = {"device": device_name(device), "torch": torch.__version__, "cpus": os.cpu_count(),
              "entropy_batch": defaults.get("entropy_batch"),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "folder": {"distinct": len(folder.images), "files": folder.files}, "runs": []}
    if plan.kvikio:
        report["kvikio_mode"] = kvikio_io.mode()
    runs = report["runs"]
    cfg = lambda streams, loader=args.loader: CompressConfig(args.model, args.quality, args.max_error, "zstd", device,
                                                             streams, False, loader)
    single, single_dst = compress_row("b: visemz 1 stream", folder.src, folder.distinct, out, cfg(1), args.repeat)
    runs.append(single)
    multi = {}
    for n in args.streams:
        r, dst = compress_row(f"c: visemz {n} streams", folder.src, folder.distinct, out, cfg(n), args.repeat)
        runs.append(r)
        multi[n] = (r, dst)
    reference = vsz_digests(single_dst)
    for r, dst in multi.values():
        r["same_bytes_as_one_stream"] = vsz_digests(dst) == reference
    best_n = max(multi, key=lambda n: multi[n][0]["images_per_s"])
    best = multi[best_n][0]
    dec = {1: decompress_row("b: decompress 1 stream", single_dst, out, DecompressConfig("npy", device, 1),
                             args.repeat)}
    for n, (_, dst) in multi.items():
        dec[n] = decompress_row(f"c: decompress {n} streams", dst, out, DecompressConfig("npy", device, n), args.repeat)
    runs += list(dec.values())

    per_file = {r["file"]: r for r in verify(folder.distinct, out / f"warm-{slug(best['label'])}", device)}
    measured = subset(folder.images, 8 if args.quick else None)  # the images PSNR and bpp are compared on
    vz_psnr, vz_bpp, vz_error = quality_of(measured, per_file)
    report["quality"] = {"images": len(measured), "visemz": {"psnr": vz_psnr and round(vz_psnr, 3),
                                                             "bpp": round(vz_bpp, 4), "max_error": vz_error}}

    ratios = report.setdefault("ratios", {})
    ratios["multi_over_single"] = round(best["images_per_s"] / single["images_per_s"], 3)
    ratios["compress_over_decompress"] = round(best["images_per_s"] / dec[best_n]["images_per_s"], 3)
    if not args.no_compressai:
        ca = compressai_row(measured, folder.distinct, out, args.model, args.quality, device, args.repeat)
        runs.append(ca)
        report["quality"]["compressai"] = {"psnr": ca["psnr"], "bpp": ca["bpp"]}
        ratios["multi_over_compressai"] = round(best["images_per_s"] / ca["images_per_s"], 3)
    if not args.no_jpeg:
        q, j_psnr, j_bpp = jpeg_quality_for(measured, vz_psnr, device)
        report["quality"]["nvjpeg"] = {"jpeg_quality": q, "psnr": round(j_psnr, 3), "bpp": round(j_bpp, 4)}
        jdst = out / "nvjpeg"
        jpeg_folder(folder.distinct, out / "warm-nvjpeg", q, device, best_n, args.loader)
        seconds, summary = timed(lambda: jpeg_folder(folder.src, jdst, q, device, best_n, args.loader),
                                 lambda: shutil.rmtree(jdst, ignore_errors=True), args.repeat, device)
        j = row(f"d: nvjpeg q{q} {best_n} streams", seconds, summary, streams=best_n, loader=args.loader)
        runs.append(j)
        ratios["multi_over_nvjpeg"] = round(best["images_per_s"] / j["images_per_s"], 3)
        ratios["bits_saved_vs_jpeg"] = round(1 - vz_bpp / j_bpp, 3)
    loader_rows(args, folder, out, cfg, best_n, report)
    return report


def loader_rows(args, folder: Folder, out: Path, cfg, n: int, report: dict) -> None:
    """DALI against the CPU loader (the source files), kvikio against it (.npy copies), at n streams."""
    ratios, runs = report["ratios"], report["runs"]
    plan = sources.installed_plan("auto", args.device)
    if plan.dali and not args.no_dali:
        d, _ = compress_row(f"loader dali {n} streams", folder.src, folder.distinct, out, cfg(n, "dali"), args.repeat)
        c, _ = compress_row(f"loader cpu {n} streams", folder.src, folder.distinct, out, cfg(n, "cpu"), args.repeat)
        runs += [d, c]
        ratios["dali_over_cpu_loader"] = round(d["images_per_s"] / c["images_per_s"], 3)
        # the formats DALI decodes on the GPU: the same folder as JPEG files
        copies = folder.files // len(folder.images)
        jpg = converted_folder(folder.images, folder.src.parent / "jpg", copies, ".jpg", save_jpeg)
        d, _ = compress_row(f"jpeg dali {n} streams", jpg, jpg / "rep000", out, cfg(n, "dali"), args.repeat)
        c, _ = compress_row(f"jpeg cpu {n} streams", jpg, jpg / "rep000", out, cfg(n, "cpu"), args.repeat)
        runs += [d, c]
        ratios["dali_over_cpu_loader_jpeg"] = round(d["images_per_s"] / c["images_per_s"], 3)
    if folder.npy is not None:
        npy_distinct = folder.npy / "rep000"
        k, _ = compress_row(f"npy kvikio {n} streams", folder.npy, npy_distinct, out, cfg(n, "kvikio"), args.repeat)
        c, _ = compress_row(f"npy cpu {n} streams", folder.npy, npy_distinct, out, cfg(n, "cpu"), args.repeat)
        runs += [k, c]
        ratios["kvikio_over_cpu_loader"] = round(k["images_per_s"] / c["images_per_s"], 3)


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU only"


# ------------------------------------------------------------------ several GPUs
def multi_gpu(args, work: Path) -> dict | None:
    """Under torchrun: the folder on rank 0's GPU alone, then sharded over every rank's GPU (more ranks than
    GPUs share them in turn, rank r on GPU r mod count, as ``visemz compress`` under torchrun does)."""
    from visemz import cli

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cli._use_local_gpu(share=True)
    dist.init_process_group("gloo")
    if rank == 0:
        build_folder(args.data, work, args.repeat_to, with_npy=False)
    dist.barrier()
    src = work / "src"
    n = max(args.streams)
    cfg = CompressConfig(args.model, args.quality, args.max_error, "zstd", "cuda", n, False, args.loader)
    out = work / "out"
    compress_folder(src / "rep000", out / f"warm-{rank}", cfg)  # every rank warms up its own GPU
    dist.barrier()
    one = None
    if rank == 0:
        seconds, summary = timed(lambda: compress_folder(src, out / "one", cfg),
                                 lambda: shutil.rmtree(out / "one", ignore_errors=True), args.repeat, "cuda")
        one = row(f"1 GPU, {n} streams", seconds, summary)
    times, summary = [], None
    for _ in range(args.repeat):
        if rank == 0:
            shutil.rmtree(out / "all", ignore_errors=True)
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        summary = compress_folder(src, out / "all", cfg, rank=rank, world=world)
        torch.cuda.synchronize()
        dist.barrier()  # the run ends when the slowest rank is done
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    if rank != 0:
        return None
    gpus = min(world, torch.cuda.device_count())
    where = f"{world} GPUs" if gpus == world else f"{world} processes on {gpus} GPU{'s' if gpus > 1 else ''}"
    both = row(f"{where}, {n} streams each", statistics.median(times), summary, ranks=world)
    return {"device": device_name("cuda"), "gpus": gpus, "processes": world, "torch": torch.__version__,
            "runs": [one, both], "ratios": {"all_gpus_over_one": round(both["images_per_s"] / one["images_per_s"], 3)}}


# ------------------------------------------------------------------ main
def print_table(report: dict) -> None:
    print(f"\n{report['device']}: {report.get('folder', {})}")
    head = ["run", "images/s", "MB/s", "bpp", "failed", "loaders", "calls per nvCOMP launch"]
    print("\n".join(markdown.table(head, ([r["label"], r["images_per_s"], r["MB_per_s"], r["bpp"], r["failed"],
                                          r["loaders"], r.get("calls_per_nvcomp_launch", "")]
                                         for r in report["runs"]))))
    print("quality:", json.dumps(report.get("quality", {})))
    print("ratios:", json.dumps(report.get("ratios", {})))


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"device: {device_name(args.device)}", flush=True)
    temp = args.work is None
    work = Path(tempfile.mkdtemp(prefix="bench_pipeline_")) if temp else args.work
    work.mkdir(parents=True, exist_ok=True)
    try:
        report = multi_gpu(args, work) if args.torchrun else single_gpu(args, work)
    finally:
        if temp and (not args.torchrun or os.environ.get("RANK", "0") == "0"):
            shutil.rmtree(work, ignore_errors=True)
    if report is not None:
        writers.write_atomic(args.out, (json.dumps(report, indent=1) + "\n").encode())
        print_table(report)
        if differing_runs(report):
            raise SystemExit(f"several streams wrote other bytes than one stream: {differing_runs(report)}")


if __name__ == "__main__":
    main()
