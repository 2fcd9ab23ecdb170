"""Folder jobs: compress, decompress and verify trees of images, item by item.

Each item is independent: a bad file is reported and skipped, the rest go on.  A rerun
skips outputs that are complete (their container parses and every checksum matches),
so an interrupted job resumes without redoing work; outputs are written atomically,
so no partial file ever carries a final name.  Inputs are only ever read.

Compression and decompression run on the multi-stream executor (``executor.py``): loaders
(``sources.py``) feed N lanes, each with its own CUDA stream on a GPU, and writer threads.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .. import container, measure, pages
from ..codec import ImageCodec
from ..config import DEFAULTS, cpu_threads
from ..errors import InvalidArgumentError, LimitExceededError, VisemzError
from ..models import graphs
from ..models.registry import DEFAULT_MODEL, DEFAULT_QUALITY
from ..io import files, loaders, writers
from . import executor, kvikio_io, sources
from .results import ItemResult, Summary

__all__ = ["CompressConfig", "DecompressConfig", "ItemResult", "Summary", "compress_folder", "decompress_folder",
           "verify", "is_complete"]

MANIFEST = "visemz-manifest.json"
FORMATS = {"png": ".png", "tiff": ".tif", "npy": ".npy"}
WRITERS = ("auto", "kvikio", "posix")


@dataclass(frozen=True)
class CompressConfig:
    model: str = DEFAULT_MODEL
    quality: float = DEFAULT_QUALITY
    max_error: float | None = None
    entropy: str = "zstd"
    device: str | None = None
    streams: int = 0  # compute lanes (CUDA streams on a GPU); 0: VISEMZ_STREAMS or automatic
    resume: bool = True
    loader: str = ""  # "auto", "dali", "kvikio" or "cpu"; "": VISEMZ_LOADER
    tile: int = 0  # core tile size in pixels (a multiple of 64); 0: VISEMZ_TILE
    refine: int | None = None  # encoder-side latent refinement steps; None: VISEMZ_REFINE


@dataclass(frozen=True)
class DecompressConfig:
    fmt: str = "png"  # "png", "tiff" or "npy"
    device: str | None = None
    streams: int = 0
    writer: str = "auto"  # "kvikio" writes .npy from GPU memory; "auto": when on a GPU with kvikio
    region: tuple[int, int, int, int] | None = None  # (y0, y1, x0, x1): decode only that window

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise InvalidArgumentError(f"format {self.fmt!r}: expected png, tiff or npy")
        if self.writer not in WRITERS:
            raise InvalidArgumentError(f"writer {self.writer!r}: expected one of {', '.join(WRITERS)}")


def is_complete(path: Path) -> bool:
    """True when ``path`` holds a whole, checksum-valid image (or page stack) container."""
    try:
        return container.unpack(path.read_bytes()).kind in ("image", pages.KIND)
    except (OSError, VisemzError):
        return False


# ------------------------------------------------------------------ shared machinery
class _FirstUse:
    """Runs the first use of each model (key) alone on a GPU, then synchronises the device.

    The codec loads weights, builds float64 copies and compiles kernels lazily, on the stream
    of whichever lane comes first; another lane's stream would not wait for those copies.
    One lane at a time per new key, and a device-wide sync after it, make them complete
    before any other stream reads them."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.seen: set = set()
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def first(self, key):
        if self.cuda and key not in self.seen:
            with self.lock:
                if key not in self.seen:
                    yield

                    graphs.synchronize()
                    self.seen.add(key)
                    return
        yield


def _out_of_memory(e: BaseException, rel: str, shape) -> LimitExceededError:
    return LimitExceededError(f"{rel}: out of GPU memory for an image of shape {tuple(shape)}: {str(e).splitlines()[0]}")


def _run(names: list[str], feeds: list, compute, write, device: str, streams: int, progress) -> tuple[list, int]:
    lanes, depth = executor.resolve(executor.ExecutorConfig(streams), device)
    results = executor.run(names, feeds, compute, write, executor.make_lanes(device, lanes), depth,
                           progress=progress)
    return results, lanes


def _device_index(device: str) -> int | None:
    if device != "cuda":
        return None

    return torch.cuda.current_device()


# ------------------------------------------------------------------ compress
@dataclass(frozen=True)
class _Encoded:
    """A compressed item on its way to a writer (the pixels are not kept alive)."""

    data: bytes
    bytes_in: int
    pixels: int  # H x W, times the pages of a stack
    loader: str
    note: str


def compress_folder(src: Path, dst: Path, cfg: CompressConfig = CompressConfig(), progress=None,
                    rank: int = 0, world: int = 1) -> Summary:
    codec = ImageCodec(cfg.device, entropy=cfg.entropy)
    plan = sources.installed_plan(cfg.loader or DEFAULTS.loader, codec.device)
    items = files.shard(files.plan(src, dst, files.discover(src, files.IMAGE_EXTENSIONS), files.compressed_name), rank, world)
    gate = _FirstUse(codec.device)

    def one(pixels) -> bytes:
        return codec.compress(pixels, model=cfg.model, quality=cfg.quality, max_error=cfg.max_error,
                              tile=cfg.tile or None, refine=cfg.refine)

    def compute(lane, i: int, pic: loaders.Picture) -> _Encoded:
        try:
            pixels = lane.to_device(pic.pixels)
            with gate.first((pic.page_shape[2:], str(pic.pixels.dtype))):
                data = pages.encode(pixels, one) if pic.paged else one(pixels)
        except torch.cuda.OutOfMemoryError as e:
            raise _out_of_memory(e, items[i].rel, pic.pixels.shape) from None
        lane.finish()
        return _Encoded(data, pic.nbytes, measure.pixel_count(pic.pixels.shape, pic.paged), pic.loader, pic.note)

    def write(i: int, enc: _Encoded) -> ItemResult:
        writers.write_atomic(items[i].dst, enc.data)
        return ItemResult(items[i].rel, "done", enc.bytes_in, len(enc.data), enc.pixels, loader=enc.loader, note=enc.note)

    t0 = time.perf_counter()
    feeds = sources.feeds(items, plan, _device_index(codec.device),
                          skip=(lambda it: it.dst.exists() and is_complete(it.dst)) if cfg.resume else None)
    results, lanes = _run([it.rel for it in items], feeds, compute, write, codec.device, cfg.streams, progress)
    summary = Summary(results, time.perf_counter() - t0)
    per_rank = _gather_summaries(summary, world)
    if rank == 0:
        everything = Summary([r for s in per_rank for r in s.results], max(s.seconds for s in per_rank))
        manifest = {"source": str(src), "config": asdict(cfg), "device": codec.device, "streams": lanes,
                    "loaders": plan.names, "ranks": world, "summary": everything.to_dict(),
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
    gathered: list = [None] * world
    dist.all_gather_object(gathered, summary)
    return gathered


# ------------------------------------------------------------------ decompress
@dataclass(frozen=True)
class _Decoded:
    pixels: object  # NumPy array, or a CUDA tensor for the kvikio writer
    paged: bool
    bytes_in: int


def _restored_name(ext: str):
    def to_name(rel: str) -> str:
        stem = rel[: -len(files.SUFFIX)]
        return stem if stem.lower().endswith(ext) else stem + ext

    return to_name


def _model_key(f: pages.Unpacked) -> frozenset:
    """The models (and error-bound modes) a file's images use: the first-use gate's key."""
    return frozenset((str(c.meta.get("model")), c.meta.get("residual") is not None) for c in f.images)


def decompress_folder(src: Path, dst: Path, cfg: DecompressConfig = DecompressConfig(), progress=None) -> Summary:
    codec = ImageCodec(cfg.device)
    gpu_writer = cfg.fmt == "npy" and codec.device == "cuda" and (
        cfg.writer == "kvikio" or (cfg.writer == "auto" and kvikio_io.available()))
    if cfg.writer == "kvikio" and not gpu_writer:
        kvikio_io.require()  # names what is missing
        raise InvalidArgumentError("writer 'kvikio' writes .npy from GPU memory: it needs --format npy and device 'cuda'")
    items = files.plan(src, dst, files.discover(src, suffix=files.SUFFIX), _restored_name(FORMATS[cfg.fmt]))
    gate = _FirstUse(codec.device)
    decode_one = codec.decompress_tensor if gpu_writer else codec.decompress

    def read(i: int) -> bytes:
        try:
            return items[i].src.read_bytes()
        except OSError as e:
            raise loaders.InputError(f"cannot read {items[i].rel}: {e.strerror}") from None

    def compute(lane, i: int, data: bytes) -> _Decoded:
        try:
            f = pages.unpack(data)  # once: the gate's key and the decode read the same containers
            with gate.first(_model_key(f)):
                pixels, paged = pages.decode(f, decode_one, cfg.region)
            if gpu_writer:
                pixels = pixels.contiguous()  # RGB comes out of the network as a permuted view
        except torch.cuda.OutOfMemoryError as e:
            raise _out_of_memory(e, items[i].rel, ()) from None
        lane.finish()
        return _Decoded(pixels, paged, len(data))

    def write(i: int, dec: _Decoded) -> ItemResult:
        item, px = items[i], dec.pixels
        if gpu_writer:
            size = kvikio_io.write_npy(item.dst, px)
        else:
            out = loaders.save_image(item.dst, px, cfg.fmt, dec.paged)
            writers.write_atomic(item.dst, out)
            size = len(out)
        return ItemResult(item.rel, "done", dec.bytes_in, size, measure.pixel_count(px.shape, dec.paged))

    t0 = time.perf_counter()
    feeds = [executor.parallel_feed(range(len(items)), read, cpu_threads())]
    results, _ = _run([it.rel for it in items], feeds, compute, write, codec.device, cfg.streams, progress)
    return Summary(results, time.perf_counter() - t0, vsz_in=True)


# ------------------------------------------------------------------ verify
def verify(src: Path, dst: Path, device: str | None = None) -> list[dict]:
    """Decode every output of ``src`` under ``dst`` and compare: PSNR and max error per image."""
    codec = ImageCodec(device)
    rows = []
    for item in files.plan(src, dst, files.discover(src, files.IMAGE_EXTENSIONS), files.compressed_name):
        row = {"file": item.rel}
        try:
            img = loaders.load(item.src).pixels
            rec, _ = pages.decode(item.dst.read_bytes(), codec.decompress)
            if rec.shape != img.shape:
                raise InvalidArgumentError(f"{item.rel}: decoded shape {rec.shape} differs from the input's {img.shape}")
            row.update(psnr=round(measure.psnr(img, rec), 3), max_error=measure.max_abs_error(img, rec),
                       bytes=item.dst.stat().st_size)
        except OSError as e:
            row["error"] = f"cannot read: {e.strerror}"
        except VisemzError as e:
            row["error"] = str(e)
        rows.append(row)
    return rows
