"""Folder jobs: compress, decompress and verify trees of images, item by item.

Each item is independent: a bad file is reported and skipped, the rest go on.  A rerun
skips outputs that are complete (their container parses and every checksum matches),
so an interrupted job resumes without redoing work; outputs are written atomically,
so no partial file ever carries a final name.  Inputs are only ever read.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import container
from ..config import cpu_threads
from ..errors import VisemzError
from . import files, loaders, writers

MANIFEST = "visemz-manifest.json"


@dataclass(frozen=True)
class CompressConfig:
    model: str = "balle2016"
    quality: int = 3
    max_error: float | None = None
    entropy: str = "zstd"
    device: str | None = None
    workers: int = 0  # 0: one per CPU core (CPU) or 4 (GPU)
    resume: bool = True


@dataclass
class ItemResult:
    rel: str
    status: str  # "done", "skipped" or "failed"
    bytes_in: int = 0
    bytes_out: int = 0
    pixels: int = 0
    error: str = ""


@dataclass
class Summary:
    results: list[ItemResult] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[ItemResult]:
        return [r for r in self.results if r.status == "failed"]

    def to_dict(self) -> dict:
        done = [r for r in self.results if r.status == "done"]
        bytes_in = sum(r.bytes_in for r in done)
        bytes_out = sum(r.bytes_out for r in done)
        pixels = sum(r.pixels for r in done)
        return {
            "items": len(self.results), "done": len(done), "skipped": self.count("skipped"),
            "failed": len(self.failed), "seconds": round(self.seconds, 3),
            "images_per_s": round(len(done) / self.seconds, 3) if self.seconds else None,
            "MB_per_s": round(bytes_in / 1e6 / self.seconds, 3) if self.seconds else None,
            "bytes_in": bytes_in, "bytes_out": bytes_out,
            "ratio": round(bytes_in / bytes_out, 3) if bytes_out else None,
            "bpp": round(8 * bytes_out / pixels, 4) if pixels else None,
            "errors": [{"file": r.rel, "error": r.error} for r in self.failed],
        }


def is_complete(path: Path) -> bool:
    """True when ``path`` holds a whole, checksum-valid image container."""
    try:
        return container.unpack(path.read_bytes()).kind == "image"
    except (OSError, VisemzError):
        return False


def _workers(cfg_workers: int, device: str) -> int:
    return cfg_workers or (4 if device == "cuda" else cpu_threads())


def _run(items, fn, workers: int, progress) -> Summary:
    t0 = time.perf_counter()
    summary = Summary()
    with ThreadPoolExecutor(max(1, workers)) as pool:  # pool.map keeps memory bounded to in-flight items
        for result in pool.map(fn, items):
            summary.results.append(result)
            if progress:
                progress(result)
    summary.seconds = time.perf_counter() - t0
    return summary


def compress_folder(src: Path, dst: Path, cfg: CompressConfig = CompressConfig(), progress=None,
                    rank: int = 0, world: int = 1) -> Summary:
    from ..codec import ImageCodec

    codec = ImageCodec(cfg.device, entropy=cfg.entropy)
    items = files.shard(files.plan(src, dst, files.discover(src, files.IMAGE_EXTENSIONS), files.compressed_name), rank, world)
    # one GPU workspace per device for now, so GPU work is serialised; CPU work runs in parallel
    guard = threading.Lock() if codec.device == "cuda" else contextlib.nullcontext()

    def one(item: files.Item) -> ItemResult:
        if cfg.resume and item.dst.exists() and is_complete(item.dst):
            return ItemResult(item.rel, "skipped")
        try:
            img = loaders.load_image(item.src)
            with guard:
                buf = codec.compress(img, model=cfg.model, quality=cfg.quality, max_error=cfg.max_error)
            writers.write_atomic(item.dst, buf)
            return ItemResult(item.rel, "done", img.nbytes, len(buf), img.shape[0] * img.shape[1])
        except VisemzError as e:
            return ItemResult(item.rel, "failed", error=str(e))

    summary = _run(items, one, _workers(cfg.workers, codec.device), progress)
    per_rank = _gather_summaries(summary, world)
    if rank == 0:
        everything = Summary([r for s in per_rank for r in s.results], max(s.seconds for s in per_rank))
        manifest = {"source": str(src), "config": asdict(cfg), "ranks": world, "summary": everything.to_dict(),
                    "per_rank": [s.to_dict() for s in per_rank],
                    "files": [dict(asdict(r), rank=i) for i, s in enumerate(per_rank) for r in s.results]}
        try:
            writers.write_atomic(dst / MANIFEST, json.dumps(manifest, indent=1).encode())
        except VisemzError:
            pass  # the per-item errors already say why the folder is not writable
        return everything  # rank 0 reports the whole run
    return summary


def _gather_summaries(summary: Summary, world: int) -> list[Summary]:
    """Every rank's summary (rank order); needs torch.distributed initialised when world > 1."""
    if world == 1:
        return [summary]
    import torch.distributed as dist

    gathered: list = [None] * world
    dist.all_gather_object(gathered, summary)
    return gathered


def decompress_folder(src: Path, dst: Path, fmt: str = "png", device: str | None = None, progress=None,
                      workers: int = 0) -> Summary:
    from ..codec import ImageCodec

    codec = ImageCodec(device)
    ext = {"png": ".png", "tiff": ".tif", "npy": ".npy"}[fmt]
    to_name = lambda rel: rel[: -len(files.SUFFIX)] + (ext if not rel[: -len(files.SUFFIX)].lower().endswith(ext) else "")
    items = files.plan(src, dst, files.discover(src, suffix=files.SUFFIX), to_name)

    def one(item: files.Item) -> ItemResult:
        try:
            data = item.src.read_bytes()
            img = codec.decompress(data)
            out = loaders.save_image(item.dst, img, fmt)
            writers.write_atomic(item.dst, out)
            return ItemResult(item.rel, "done", len(data), len(out), img.shape[0] * img.shape[1])
        except OSError as e:
            return ItemResult(item.rel, "failed", error=f"cannot read {item.rel}: {e.strerror}")
        except VisemzError as e:
            return ItemResult(item.rel, "failed", error=str(e))

    return _run(items, one, _workers(workers, codec.device), progress)


def verify(src: Path, dst: Path, device: str | None = None) -> list[dict]:
    """Decode every output of ``src`` under ``dst`` and compare: PSNR and max error per image."""
    from ..codec import ImageCodec

    codec = ImageCodec(device)
    rows = []
    for item in files.plan(src, dst, files.discover(src, files.IMAGE_EXTENSIONS), files.compressed_name):
        row = {"file": item.rel}
        try:
            img = loaders.load_image(item.src)
            rec = codec.decompress(item.dst.read_bytes())
            diff = img.astype(np.float64) - rec.astype(np.float64)
            peak = {"uint8": 255.0, "uint16": 65535.0}.get(str(img.dtype), float(np.ptp(img)) or 1.0)
            mse = float(np.mean(diff**2))
            row.update(psnr=round(10 * np.log10(peak**2 / mse), 3) if mse else float("inf"),
                       max_error=float(np.abs(diff).max()), bytes=item.dst.stat().st_size)
        except OSError as e:
            row["error"] = f"cannot read: {e.strerror}"
        except VisemzError as e:
            row["error"] = str(e)
        rows.append(row)
    return rows
