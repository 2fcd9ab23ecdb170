"""Folder jobs: compress, decompress and verify trees of images, item by item.

Inputs are only ever read: a destination that is, contains or lies inside its source (or the
other way round) is refused before any work, and no job writes over a file it did not create
(``manifest.py``: each output is recorded, with its source's identity and its settings, before it
is renamed into place).  Each item is independent: a bad file (unreadable, undecodable, too large
for memory, a link out of the tree or in a loop, a device) is reported as failed with its reason
and the rest go on; every file ends in the manifest as done, skipped or failed.  A rerun skips
the outputs that are current, makes again those whose source changed or whose settings differ
(saying why), and removes the temporary files a killed run left.  Outputs are written atomically,
so no partial file ever carries a final name.

Compression and decompression run on the multi-stream executor (``executor.py``): loaders
(``sources.py``) feed N lanes, each with its own CUDA stream on a GPU, and writer threads.  On
the CPU the lanes share the memory there is (``memory.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from .. import container, defaults, measure
from ..defaults import cpu_threads
from ..device import as_numpy
from ..errors import InvalidArgumentError, LimitExceededError, VisemzError
from ..image import codec as codec_module
from ..image import pages
from ..image.codec import ImageCodec
from ..image.refine import check_steps
from ..image.tiling import check_tile
from ..io import files, loaders
from ..models import graphs, registry
from ..models import weights as W
from . import checks, destination, executor, kvikio_io, memory, sources
from .manifest import MANIFEST
from .results import ItemResult, Summary
from .settings import (
    AUTO,
    FORMATS,
    CompressConfig,
    DecompressConfig,
    check_compress,
    check_decompress,
    check_weights_installed,
)

__all__ = ["CompressConfig", "DecompressConfig", "ItemResult", "Summary", "compress_folder", "decompress_folder",
           "verify", "is_complete", "MANIFEST"]

BY_SUFFIX = {".png": "png", ".tif": "tiff", ".tiff": "tiff", ".npy": "npy"}  # source types written back as they were


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
    return LimitExceededError(f"{files.shown(rel)}: out of GPU memory for an image of shape {tuple(shape)}: "
                              f"{str(e).splitlines()[0]}")


def _gate(device: str, streams: int, world: int):
    """The memory gate of a job's lanes: on the CPU with an automatic number of lanes, the memory
    there is shared by the processes of this host; no gate when the user chose the lanes."""
    if device != "cpu" or streams or defaults.get("streams"):
        return memory.NoGate()
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or world)  # torchrun's processes of this host
    return memory.MemoryGate(memory.budget(local))


def _run(names: list[str], feeds: list, compute, write, device: str, streams: int, progress) -> tuple[list, int]:
    lanes, depth = executor.resolve(executor.ExecutorConfig(streams), device)
    results = executor.run(names, feeds, compute, write, executor.make_lanes(device, lanes), depth, progress=progress)
    return results, lanes


def _device_index(device: str) -> int | None:
    if device != "cuda":
        return None

    return torch.cuda.current_device()


def _planned(src: Path, dst: Path, extensions, suffix: str, to_name, what: str) -> list[files.Item]:
    """The items of a job, checked before anything is written: source and destination apart, at
    least one input, no two inputs with one output."""
    files.check_source(src, dst, extensions, suffix, what)
    items, seen = [], {}
    for it in files.plan(src, dst, files.discover(src, extensions, suffix), to_name):
        if it.dst in seen and not it.problem:
            it = files.Item(it.src, it.dst, it.rel, f"its output '{files.shown(it.dst.name)}' is also the output "
                                                    f"of '{files.shown(seen[it.dst])}'")
        seen.setdefault(it.dst, it.rel)
        items.append(it)
    return items


def _gather_summaries(summary: Summary, world: int) -> list[Summary]:
    """Every rank's summary (rank order); needs torch.distributed initialised when world > 1."""
    if world == 1:
        return [summary]
    gathered: list = [None] * world
    dist.all_gather_object(gathered, summary)
    return gathered


def _merged(per_rank: list[Summary], vsz_in: bool = False) -> Summary:
    notes = [n for s in per_rank for n in s.notes]
    warnings = [w for s in per_rank for w in s.warnings]
    return Summary([r for s in per_rank for r in s.results], max(s.seconds for s in per_rank), vsz_in, notes, warnings)


def _start(progress, total: int) -> None:
    if progress is not None and hasattr(progress, "start"):
        progress.start(total)


# ------------------------------------------------------------------ compress
@dataclass(frozen=True)
class _Encoded:
    """A compressed item on its way to a writer (the pixels are not kept alive)."""

    data: bytes
    bytes_in: int
    pixels: int  # H x W, times the pages of a stack
    loader: str
    note: str
    source: files.Identity | None


def shaping(cfg: CompressConfig) -> dict:
    """Every setting that shapes a compressed file, resolved (a rerun with any of them changed makes
    the file again): the codec's, the runtime defaults' that change its bytes, the format and the weights."""
    def weights_id(variant: str) -> str | None:
        try:
            return W.file_id(W.weights_path(registry.spec(cfg.model, variant)))
        except OSError:
            return None

    now = defaults.current()  # one snapshot: the settings the job's files are made with
    return {"model": cfg.model, "quality": float(cfg.quality),
            "max_error": None if cfg.max_error is None else float(cfg.max_error), "entropy": cfg.entropy,
            "tile": cfg.tile or now.tile, "refine": now.refine if cfg.refine is None else cfg.refine,
            "format": codec_module.FORMAT, "weights": {v: weights_id(v) for v in registry.VARIANTS},
            "entropy_chunk": now.entropy_chunk, "zstd_level": now.zstd_level, "rans_skip_freq": now.rans_skip_freq}


def check_settings(cfg: CompressConfig) -> str:
    """Every compression setting, checked before any file; returns the device."""
    device = check_compress(cfg)
    check_weights_installed(cfg.model)
    if cfg.tile:
        check_tile(cfg.tile, "--tile")
    if cfg.refine is not None:
        check_steps(cfg.refine)
    return device


class _LossCheck:
    """Decodes the job's first lossy 16-bit image (uint16 or int16) and warns when its error took much of the
    range."""

    def __init__(self, cfg: CompressConfig):
        self.wanted = cfg.max_error is None
        self.lock = threading.Lock()
        self.warnings: list[str] = []

    def __call__(self, rel: str, pic: loaders.Picture, data: bytes, codec: ImageCodec, first: _FirstUse) -> None:
        if not self.wanted or str(pic.pixels.dtype).replace("torch.", "") not in ("uint16", "int16"):
            return
        with self.lock:
            if not self.wanted:
                return
            self.wanted = False
        ref = as_numpy(pic.pixels)
        with first.first("decode"):  # the job's only decode: a first use on a GPU
            rec, _ = pages.decode(data, codec.decompress)
        warning = checks.lost_range(files.shown(rel), ref, np.asarray(rec))
        if warning:
            self.warnings.append(warning)


def compress_folder(src: Path, dst: Path, cfg: CompressConfig = CompressConfig(), progress=None,
                    rank: int = 0, world: int = 1) -> Summary:
    device = check_settings(cfg)
    plan = sources.installed_plan(cfg.loader or defaults.get("loader"), device)
    extensions, suffix, what = files.IMAGES
    items = files.shard(_planned(src, dst, extensions, suffix, files.compressed_name, what), rank, world)
    codec = ImageCodec(device, entropy=cfg.entropy)
    settings = shaping(cfg)
    gate, first, loss = _gate(codec.device, cfg.streams, world), _FirstUse(codec.device), _LossCheck(cfg)
    owned: dict = {}
    reasons: dict = {}

    def one(pixels) -> bytes:
        return codec.compress(pixels, model=cfg.model, quality=cfg.quality, max_error=cfg.max_error,
                              tile=cfg.tile or None, refine=cfg.refine)

    def compute(lane, i: int, pic: loaders.Picture) -> _Encoded:
        page_pixels = measure.pixel_count(pic.page_shape)
        try:
            with gate.hold(memory.estimate(page_pixels, cfg.max_error is not None)):
                pixels = lane.to_device(pic.pixels)
                with first.first((pic.page_shape[2:], str(pic.pixels.dtype))):
                    data = pages.encode(pixels, one) if pic.paged else one(pixels)
                lane.finish()
                loss(items[i].rel, pic, data, codec, first)
        except torch.cuda.OutOfMemoryError as e:
            raise _out_of_memory(e, items[i].rel, pic.pixels.shape) from None
        return _Encoded(data, pic.nbytes, measure.pixel_count(pic.pixels.shape, pic.paged), pic.loader, pic.note,
                        pic.source)

    with destination.Destination(dst, rank, world, legacy_owned=is_complete) as dest:
        def write(i: int, enc: _Encoded) -> ItemResult:
            rec = dest.place(items[i], enc.data, settings, enc.source, owned.get(i))
            return ItemResult(items[i].rel, "done", enc.bytes_in, len(enc.data), enc.pixels, loader=enc.loader,
                              note=enc.note, record=rec)

        _start(progress, len(items))
        t0 = time.perf_counter()
        feeds = sources.feeds(items, plan, _device_index(codec.device),
                              triage=dest.triage(items, settings, cfg.resume, owned, reasons))
        results, lanes = _run([it.rel for it in items], feeds, compute, write, codec.device, cfg.streams, progress)
        summary = Summary(destination.finished(results, items, dest, owned, reasons), time.perf_counter() - t0,
                          notes=dest.notes, warnings=loss.warnings)
        per_rank = _gather_summaries(summary, world)
        if rank != 0:
            return summary
        everything = _merged(per_rank)
        dest.finish(everything, per_rank, items, {
            "job": "compress", "source": files.shown(src), "config": asdict(cfg), "settings": settings,
            "device": codec.device, "streams": lanes, "loaders": plan.names, "ranks": world,
            "memory_budget_bytes": None if gate.budget == float("inf") else gate.budget})
        return everything  # rank 0 reports the whole run


# ------------------------------------------------------------------ decompress
@dataclass(frozen=True)
class _Decoded:
    pixels: object  # NumPy array, or a CUDA tensor for the kvikio writer
    paged: bool
    bytes_in: int
    pixels_whole: int  # the file's pixels (bpp is the file's, whatever region was written)
    source: files.Identity | None


def restored_name(fmt: str):
    """The output name of a .vsz file: ``auto``: the source's own name when visemz writes its type
    (.png, .tif, .tiff, .npy), else the name + .png; a format: the name + its suffix unless it has it."""
    def to_name(rel: str) -> str:
        stem = rel[: -len(files.SUFFIX)]
        if fmt == AUTO:
            return stem if os.path.splitext(stem)[1].lower() in BY_SUFFIX else stem + FORMATS["png"]
        ext = FORMATS[fmt]
        return stem if stem.lower().endswith(ext) else stem + ext

    return to_name


def format_of(name: str) -> str:
    """The format an output name says: png, tiff or npy."""
    return BY_SUFFIX.get(os.path.splitext(name)[1].lower(), "png")


def _model_key(f: pages.Unpacked) -> frozenset:
    """The models (and error-bound modes) a file's images use: the first-use gate's key."""
    return frozenset((str(c.meta.get("model")), c.meta.get("residual") is not None) for c in f.images)


def _whole_pixels(f: pages.Unpacked) -> tuple[int, int, bool]:
    """(pixels of the file, pixels of one page, error-bounded) from its headers."""
    shape = f.stack[0] if f.stack is not None else f.images[0].meta.get("shape") or [0, 0]
    paged = f.stack is not None
    page = measure.pixel_count(shape[1:] if paged else shape)
    return measure.pixel_count(shape, paged), page, any(c.meta.get("max_error") is not None for c in f.images)


def decompress_folder(src: Path, dst: Path, cfg: DecompressConfig = DecompressConfig(), progress=None) -> Summary:
    device = check_decompress(cfg)
    extensions, suffix, what = files.VSZ_FILES
    items = _planned(src, dst, extensions, suffix, restored_name(cfg.fmt), what)
    codec = ImageCodec(device)
    gpu_writer = codec.device == "cuda" and cfg.fmt == "npy" and (
        cfg.writer == "kvikio" or (cfg.writer == "auto" and kvikio_io.available()))
    if cfg.writer == "kvikio" and not gpu_writer:
        kvikio_io.require()  # names what is missing
        raise InvalidArgumentError("writer 'kvikio' writes .npy from GPU memory: it needs --format npy and device "
                                   "'cuda'")
    settings = {"format": cfg.fmt, "region": list(cfg.region) if cfg.region is not None else None}
    gate, first = _gate(codec.device, cfg.streams, 1), _FirstUse(codec.device)
    decode_one = codec.decompress_tensor if gpu_writer else codec.decompress
    owned: dict = {}
    reasons: dict = {}

    def read(i: int) -> tuple[bytes, files.Identity]:
        return loaders.read_file(items[i].src)

    def compute(lane, i: int, loaded) -> _Decoded:
        data, source = loaded
        try:
            f = pages.unpack(data)  # once: the gate's key and the decode read the same containers
            whole, page, bounded = _whole_pixels(f)
            with gate.hold(memory.estimate(page, bounded)), first.first(_model_key(f)):
                pixels, paged = pages.decode(f, decode_one, cfg.region)
                if gpu_writer:
                    pixels = pixels.contiguous()  # RGB comes out of the network as a permuted view
                lane.finish()
        except torch.cuda.OutOfMemoryError as e:
            raise _out_of_memory(e, items[i].rel, ()) from None
        return _Decoded(pixels, paged, len(data), whole, source)

    with destination.Destination(dst, 0, 1) as dest:
        def write(i: int, dec: _Decoded) -> ItemResult:
            item, px = items[i], dec.pixels
            if gpu_writer:
                rec = dest.place(item, lambda before: kvikio_io.write_npy(item.dst, px, before), settings, dec.source,
                                 owned.get(i))
            else:
                out = loaders.save_image(item.dst, px, format_of(item.dst.name), dec.paged)
                rec = dest.place(item, out, settings, dec.source, owned.get(i))
            return ItemResult(item.rel, "done", dec.bytes_in, rec.output.size, dec.pixels_whole, record=rec)

        _start(progress, len(items))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(cpu_threads(), thread_name_prefix="visemz-probe") as pool:
            triaged = list(pool.map(dest.triage(items, settings, cfg.resume, owned, reasons), range(len(items))))
        finished = [(i, r) for i, r in enumerate(triaged) if r is not None]
        todo = [i for i, r in enumerate(triaged) if r is None]
        feeds = [finished, executor.parallel_feed(todo, read, cpu_threads())]
        results, _ = _run([it.rel for it in items], feeds, compute, write, codec.device, cfg.streams, progress)
        summary = Summary(destination.finished(results, items, dest, owned, reasons), time.perf_counter() - t0,
                          vsz_in=True, notes=dest.notes)
        dest.finish(summary, [summary], items, {"job": "decompress", "source": files.shown(src),
                                                "config": asdict(cfg), "settings": settings, "device": codec.device})
        return summary


# ------------------------------------------------------------------ verify
def verify(src: Path, dst: Path, device: str | None = None) -> list[dict]:
    """Decode every output of ``src`` under ``dst`` and compare: PSNR (against the data's own peak,
    ``checks.data_peak``, which each row names) and max error per image."""
    codec = ImageCodec(device)
    found = files.discover(src, files.IMAGE_EXTENSIONS)
    if not found:
        raise InvalidArgumentError(f"no images in '{files.shown(src)}': nothing to verify")
    rows = []
    for item in files.plan(src, dst, found, files.compressed_name):
        rows.append(dict(file=files.shown(item.rel), **_verified(item, codec)))
    return rows


def _verified(item: files.Item, codec: ImageCodec) -> dict:
    if item.problem:
        return {"error": f"{files.shown(item.rel)} {item.problem}"}
    try:
        img = loaders.load(item.src).pixels
        data = loaders.read_file(item.dst)[0]
        rec, _ = pages.decode(data, codec.decompress)
        if rec.shape != img.shape:
            raise InvalidArgumentError(f"{files.shown(item.rel)}: decoded shape {rec.shape} differs from the "
                                       f"input's {img.shape}")
        return dict(checks.compare(img, rec), bytes=len(data))
    except Exception as e:  # noqa: BLE001 (this file's row says why; the others go on)
        return {"error": executor.describe(e)}
