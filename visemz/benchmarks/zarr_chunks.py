"""Zarr v2 chunks of a large 16-bit mosaic: visemz's numcodecs codec against JPEG 2000 and JPEG XL.

    python -m visemz.benchmarks.zarr_chunks --data DATA/eval/xray --out zarr.json
    python -m visemz.benchmarks.zarr_chunks --data DATA/eval/xray --size 2048 --chunk 1024 --device cpu --out z.json

An S x S uint16 mosaic (``--size``, default 16384) of the images under ``--data``
(``visemz.benchmarks.common.mosaic``: gray, 8-bit images scaled by 257, each placement flipped differently; the
report counts its distinct values, since 8-bit sources leave at most 256 of them, which lossless
coders that build a palette, such as JPEG XL's, exploit) is
written by Zarr (v2, ``compressor=``) into one OME-Zarr-shaped group per codec: NGFF 0.4
``multiscales`` metadata with (y, x) axes and one level, array "0", ``--chunk`` square chunks
under "/"-separated keys, in a DirectoryStore under ``--work`` (a temporary folder, removed at the
end, by default).  The codecs (``--codecs``), in this order:

- ``visemz_lossless``: ``{"id": "visemz", "max_error": 0}`` at ``--quality``;
- ``visemz_lossy``: ``{"id": "visemz"}`` at ``--quality``;
- ``jpeg2k_lossless``: imagecodecs' ``imagecodecs_jpeg2k``, reversible (OpenJPEG, 5-3 wavelet);
- ``jpegxl_lossless``: imagecodecs' ``imagecodecs_jpegxl``, ``lossless=True`` (libjxl, default effort);
- ``jpeg2k_lossy``: imagecodecs' JPEG 2000, irreversible, at the OpenJPEG fixed-quality ``level`` (a
  PSNR target in dB for each chunk; through ``Jpeg2kFractional``, imagecodecs' codec class keeping the
  level fractional, id ``bench_zarr_jpeg2k``);
- ``jpegxl_lossy``: ``imagecodecs_jpegxl``, ``lossless=False``, at a Butteraugli ``distance``.

The lossy rows are put at visemz_lossy's rate: their setting is searched (``match_rate``: steps from a
start, then regula falsi on log bpp; at most ``--calib-steps`` trials, stopping within ``--calib-tol``)
on the bpp of the whole array, every chunk coded as Zarr stores it, so the row reports the rate the
search reached (``bpp_over_target``); the trials are in the report's ``calibration``.  Calibration
costs a few whole-array encodes per row.

visemz codes on ``--device`` (its codec's ``device`` option: cuda when there is one); imagecodecs
on the CPU, with ``--threads`` threads inside each chunk.  Zarr 2 codes the chunks one after
another.  Per codec: write seconds (the whole array, after one chunk coded untimed as a warm-up:
weights, cuDNN, thread pools), compression ratio and bpp (raw bytes against the chunk files'
bytes), read-all seconds (median of ``--read-repeats``), the seconds to read one 1024 x 1024
region off the chunk grid (it touches four chunks; median of ``--repeats`` after a warm-up),
exactness (every codec), PSNR and max error where the read differs, and peak GPU memory (what
torch's allocator held at most from a reset at the codec's start: on CUDA only, and it counts
visemz's weights cached by earlier rows).  Times are synchronised.  A missing imagecodecs, or a
codec its build lacks, is recorded as ``{"skipped": reason}``.

Prints the device and every row, and writes everything with the versions of zarr, numcodecs,
imagecodecs and visemz to ``--out`` as JSON (atomically, after every row).  Data never ships with
the repo.  imagecodecs is optional: ``pip install imagecodecs``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np
import torch
import zarr

import visemz
from visemz import measure, zarr_codecs
from visemz.benchmarks.common import Device, mib, mosaic, sources
from visemz.io.writers import write_atomic

try:  # optional: without it the JPEG 2000 / JPEG XL rows are skipped
    import imagecodecs
    import imagecodecs.numcodecs
    IMAGECODECS_MISSING = None
except ImportError as e:
    imagecodecs, IMAGECODECS_MISSING = None, f"imagecodecs is not installed ({e})"

JPEG2K_FRACTIONAL = "bench_zarr_jpeg2k"  # the jpeg2k_lossy row's codec id (registered below, in this process)

if imagecodecs is not None:
    class Jpeg2kFractional(imagecodecs.numcodecs.Jpeg2k):
        """imagecodecs' JPEG 2000 numcodecs codec with a fractional fixed-quality ``level``: the codec class of
        imagecodecs 2026 rounds ``level`` down to an integer, and one dB moves this mosaic's rate by 10-20%,
        while ``imagecodecs.jpeg2k_encode`` itself takes a float.  Encoding and decoding are imagecodecs'."""

        codec_id = JPEG2K_FRACTIONAL

        def __init__(self, *, level=None, **kwargs):
            super().__init__(level=level, **kwargs)
            self.level = None if level is None else float(level)

    numcodecs.register_codec(Jpeg2kFractional)

# Zarr reads a codec back by its id, which an installed visemz registers through its numcodecs entry points; a
# checkout run without installing (PYTHONPATH) has none, so register the codecs in this process where missing.
for _codec in (zarr_codecs.Visemz, zarr_codecs.VisemzErrorBounded, zarr_codecs.VisemzLossless):
    if _codec.codec_id not in numcodecs.registry.codec_registry:
        numcodecs.register_codec(_codec)

CODECS = ("visemz_lossless", "visemz_lossy", "jpeg2k_lossless", "jpegxl_lossless", "jpeg2k_lossy", "jpegxl_lossy")
# the imagecodecs feature each of its codecs needs (imagecodecs.<NAME>.available)
FEATURES = {"imagecodecs_jpeg2k": "JPEG2K", JPEG2K_FRACTIONAL: "JPEG2K", "imagecodecs_jpegxl": "JPEGXL"}


def configs(args, device: str) -> dict[str, dict]:
    """numcodecs configs of the codecs; the lossy rows' rate settings (``KNOBS``) are added once calibrated."""
    vz = {"id": "visemz", "quality": args.quality, "model": args.model, "device": device}
    ic = {"numthreads": args.threads}
    return {"visemz_lossless": {**vz, "max_error": 0}, "visemz_lossy": vz,
            "jpeg2k_lossless": {"id": "imagecodecs_jpeg2k", "reversible": True, **ic},
            "jpegxl_lossless": {"id": "imagecodecs_jpegxl", "lossless": True, **ic},
            "jpeg2k_lossy": {"id": JPEG2K_FRACTIONAL, "reversible": False, **ic},
            "jpegxl_lossy": {"id": "imagecodecs_jpegxl", "lossless": False, **ic}}


def unavailable(config: dict) -> str | None:
    """Why this codec cannot run here (imagecodecs missing, or built without it), or None."""
    feature = FEATURES.get(config["id"])
    if feature is None:
        return None
    if imagecodecs is None:
        return IMAGECODECS_MISSING
    if not getattr(getattr(imagecodecs, feature, None), "available", False):
        return f"imagecodecs {imagecodecs.__version__} was built without {feature}"
    probe = (np.arange(64 * 64, dtype=np.uint16) * 7).reshape(64, 64)
    try:
        back = numcodecs.get_codec(config).decode(numcodecs.get_codec(config).encode(probe))
    except Exception as e:  # a library the build links but cannot use: its own exception types
        return f"imagecodecs {imagecodecs.__version__} {feature} failed on a 64x64 uint16 probe: " \
               f"{type(e).__name__}: {e}"
    if np.asarray(back).shape != probe.shape:
        return f"imagecodecs {imagecodecs.__version__} {feature} decoded a 64x64 probe to shape " \
               f"{np.asarray(back).shape}"
    return None


# ----------------------------------------------------------------------------- OME-Zarr arrays
def create(path: Path, shape: tuple[int, int], chunk: int, codec) -> zarr.Array:
    """An OME-Zarr-shaped group at ``path`` (NGFF 0.4, one level): its level-0 array, empty."""
    group = zarr.group(store=zarr.DirectoryStore(str(path)), overwrite=True)
    group.attrs["multiscales"] = [{
        "version": "0.4", "name": path.stem,
        "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
        "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0]}]}]}]
    return group.create_dataset("0", shape=shape, chunks=(chunk, chunk), dtype="uint16", compressor=codec,
                                dimension_separator="/")


def level0(path: Path) -> zarr.Array:
    """The level-0 array opened afresh from its metadata (the codec too, through numcodecs' registry)."""
    return zarr.open_array(zarr.DirectoryStore(str(path)), mode="r", path="0")


def chunk_bytes(path: Path) -> tuple[int, int]:
    """(bytes, files) of the chunk files of level 0 (not the .zarray/.zattrs metadata)."""
    sizes = [f.stat().st_size for f in (path / "0").rglob("*") if f.is_file() and not f.name.startswith(".")]
    return sum(sizes), len(sizes)


def region_window(size: int, chunk: int) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1): a square of min(1024, chunk) around the chunk corner nearest the centre,
    shifted 37 pixels off it, so it touches four chunks."""
    side = min(1024, chunk)
    corner = min(max(round(size / 2 / chunk), 1), math.ceil(size / chunk) - 1) * chunk
    y0 = min(max(corner - side // 2 + 37, 0), size - side)
    return y0, y0 + side, y0, y0 + side


# --------------------------------------------------------------------------------- one codec
def bench_codec(dev: Device, img: np.ndarray, name: str, config: dict, work: Path, args) -> dict:
    codec = numcodecs.get_codec(config)
    path = work / f"{name}.ome.zarr"
    window = region_window(img.shape[0], args.chunk)
    y0, y1, x0, x1 = window

    def run() -> dict:
        first = np.ascontiguousarray(img[:args.chunk, :args.chunk])
        codec.decode(codec.encode(first))  # warm-up, untimed
        arr = create(path, img.shape, args.chunk, codec)
        t_write, _ = dev.timed(lambda: arr.__setitem__(Ellipsis, img), 1, warmup=0)
        stored, files = chunk_bytes(path)
        t_read, full = dev.timed(lambda: level0(path)[...], args.read_repeats, warmup=0)
        t_region, part = dev.timed(lambda: level0(path)[y0:y1, x0:x1], args.repeats, warmup=1)
        exact = bool(np.array_equal(full, img))
        row = {"config": codec.get_config(), "chunks": files, "stored_bytes": stored,
               "ratio": round(img.nbytes / stored, 3), "bpp": round(measure.bpp(stored, img.size), 4),
               "write_s": round(t_write, 4), "write_mpx_s": round(img.size / 1e6 / t_write, 2),
               "read_all_s": round(t_read, 4), "read_all_mpx_s": round(img.size / 1e6 / t_read, 2),
               "region": list(window), "region_s": round(t_region, 4),
               "region_equals_full_window": bool(np.array_equal(part, full[y0:y1, x0:x1])), "exact": exact}
        if not exact:
            row["psnr"] = round(measure.psnr(img, full), 3)
            row["max_abs_error"] = measure.max_abs_error(img, full)
        return row

    row, peak = dev.peak(run)
    row["gpu_peak_mib"] = mib(peak)
    return row


# ------------------------------------------------------------- lossy rows at visemz's rate
@dataclass(frozen=True)
class RateKnob:
    """The setting a lossy codec's rate is matched by: its config key, searched as x in [lo, hi] (the value
    is ``exp(x)`` where ``log``), from ``start`` (None: visemz's PSNR, for a PSNR target) in first steps
    of ``step``; ``increasing``: whether bpp grows with x."""

    key: str
    lo: float
    hi: float
    step: float
    increasing: bool
    start: float | None = None
    log: bool = False

    def value(self, x: float) -> float:
        return round(math.exp(x) if self.log else x, 6)


KNOBS = {
    # OpenJPEG's fixed-quality mode: a PSNR target in dB for each chunk (below 20 nothing is left; 100 is lossless)
    "jpeg2k_lossy": RateKnob("level", 20.0, 99.0, 2.0, increasing=True),
    # libjxl's Butteraugli distance (0.05 near lossless .. 25), searched in log(distance)
    "jpegxl_lossy": RateKnob("distance", math.log(0.05), math.log(25.0), 0.7, increasing=False, start=0.0, log=True),
}


def array_bpp(img: np.ndarray, chunk: int, codec) -> float:
    """Bits per pixel of the whole array coded chunk by chunk as Zarr stores it (edge chunks padded with
    the fill value 0 to the chunk shape): the bpp its row will report."""
    total = 0
    for y in range(0, img.shape[0], chunk):
        for x in range(0, img.shape[1], chunk):
            block = img[y:y + chunk, x:x + chunk]
            if block.shape != (chunk, chunk):
                block = np.pad(block, ((0, chunk - block.shape[0]), (0, chunk - block.shape[1])))
            total += len(codec.encode(np.ascontiguousarray(block)))
    return measure.bpp(total, img.size)


def match_rate(bpp_at, target: float, knob: RateKnob, start: float, tol: float, steps: int) -> dict:
    """The x whose ``bpp_at(x)`` is ``target`` within ``tol`` (relative), in at most ``steps`` calls:
    steps of growing size from ``start`` until the bpp crosses the target (or x meets a bound), then
    regula falsi (Illinois) on log(bpp / target).  Returns the trial nearest the target, and all trials."""
    trials: list[tuple[float, float]] = []

    def f(x: float) -> float:
        bpp = bpp_at(x)
        trials.append((x, bpp))
        return math.log(max(bpp, 1e-12) / target)

    def done() -> bool:
        return len(trials) >= steps or abs(math.exp(f_best()) - 1) <= tol

    def f_best() -> float:
        return min((math.log(max(b, 1e-12) / target) for _, b in trials), key=abs)

    a = min(max(start, knob.lo), knob.hi)
    fa = f(a)
    toward = (-1 if fa > 0 else 1) * (1 if knob.increasing else -1)  # the way x moves bpp toward the target
    b, fb, size = a, fa, knob.step
    while not done():
        b = min(max(a + toward * size, knob.lo), knob.hi)
        fb = f(b)
        if fa * fb <= 0 or b in (knob.lo, knob.hi):
            break
        a, fa, size = b, fb, size * 2
    while not done() and fa * fb < 0:
        c = b - fb * (b - a) / (fb - fa)
        fc = f(c)
        if fc * fb < 0:
            a, fa = b, fb
        else:
            fa /= 2
        b, fb = c, fc
    x, bpp = min(trials, key=lambda t: abs(math.log(max(t[1], 1e-12) / target)))
    return {"key": knob.key, "value": knob.value(x), "target_bpp": target, "bpp": round(bpp, 5),
            "bpp_over_target": round(bpp / target, 4), "within_tol": abs(bpp / target - 1) <= tol,
            "trials": [[knob.value(t), round(v, 5)] for t, v in trials]}


def calibrate(img: np.ndarray, name: str, config: dict, visemz_row: dict, args) -> dict:
    """``config``'s rate setting that gives the whole array visemz_lossy's bpp (``match_rate`` over
    ``array_bpp``, each trial coding every chunk)."""
    knob = KNOBS[name]
    start = knob.start if knob.start is not None else visemz_row["psnr"]

    def bpp_at(x: float) -> float:
        return array_bpp(img, args.chunk, numcodecs.get_codec({**config, knob.key: knob.value(x)}))

    target = measure.bpp(visemz_row["stored_bytes"], img.size)  # not the row's rounded bpp
    return match_rate(bpp_at, target, knob, start, args.calib_tol, args.calib_steps)


# ------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="images the mosaic is built from, e.g. DATA/eval/xray")
    ap.add_argument("--size", type=int, default=16384, help="the mosaic is SIZE x SIZE uint16 pixels")
    ap.add_argument("--chunk", type=int, default=4096, help="Zarr chunks are CHUNK x CHUNK (e.g. 4096 or 2048)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="visemz's device (auto: cuda when there is one)")
    ap.add_argument("--model", default="mbt2018-mean")
    ap.add_argument("--quality", type=float, default=4.0)
    ap.add_argument("--codecs", nargs="+", choices=CODECS, default=list(CODECS))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="imagecodecs' numthreads inside a chunk")
    ap.add_argument("--repeats", type=int, default=3, help="timed region reads, after a warm-up")
    ap.add_argument("--read-repeats", type=int, default=1, help="timed whole-array reads")
    ap.add_argument("--calib-steps", type=int, default=8,
                    help="most trials (each codes the whole array) to match a lossy row's bpp to visemz_lossy's")
    ap.add_argument("--calib-tol", type=float, default=0.02,
                    help="relative bpp difference a lossy row's calibration stops at")
    ap.add_argument("--work", type=Path, help="folder for the Zarr stores (kept); default: a temporary folder")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not 0 < args.calib_tol < 1:
        ap.error(f"--calib-tol {args.calib_tol}: must lie in (0, 1)")
    for key in ("size", "chunk", "threads", "repeats", "read_repeats", "calib_steps"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} {getattr(args, key)}: must be at least 1")
    if args.size < 2 * args.chunk:
        ap.error(f"--size {args.size} is less than two chunks of {args.chunk}: the region read would not cross chunks")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if int(zarr.__version__.split(".")[0]) != 2:
        sys.exit(f"zarr {zarr.__version__}: this benchmark writes Zarr v2 through zarr 2 (tested with 2.18.3)")
    dev = Device(args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {dev.describe()} ({dev.name}); zarr {zarr.__version__}, numcodecs {numcodecs.__version__}, "
          f"imagecodecs {getattr(imagecodecs, '__version__', None)}, visemz {visemz.__version__}", flush=True)
    if imagecodecs is not None:
        imagecodecs.numcodecs.register_codecs(verbose=False)  # Zarr reads a codec back by its id
    images = sources(args.data)
    img = mosaic(images, args.size)
    report = {"device": dev.describe(), "device_kind": dev.name, "data": str(args.data), "images": len(images),
              "distinct_values": int(np.count_nonzero(np.bincount(img.ravel(), minlength=65536))),
              "size": args.size, "chunk": args.chunk,
              "dtype": "uint16", "raw_bytes": img.nbytes, "model": args.model, "quality": args.quality,
              "threads": args.threads, "repeats": args.repeats, "read_repeats": args.read_repeats,
              "versions": {"zarr": zarr.__version__, "numcodecs": numcodecs.__version__, "visemz": visemz.__version__,
                           "imagecodecs": getattr(imagecodecs, "__version__", None), "torch": torch.__version__,
                           "numpy": np.__version__}, "rows": {}}
    rows = report["rows"]

    def save() -> None:  # after every row: a run cut off keeps what it measured
        write_atomic(args.out, (json.dumps(report, indent=1) + "\n").encode())

    with tempfile.TemporaryDirectory(prefix="bench_zarr_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name, config in configs(args, dev.name).items():
            if name not in args.codecs:
                continue
            reason = unavailable(config)
            calibration = None
            if reason is None and name in KNOBS:
                if "bpp" not in rows.get("visemz_lossy", {}):
                    reason = "needs the visemz_lossy row's bpp as its target (add visemz_lossy to --codecs)"
                else:
                    calibration = calibrate(img, name, config, rows["visemz_lossy"], args)
                    report.setdefault("calibration", {})[name] = calibration
                    print(json.dumps({f"{name}_calibration": calibration}), flush=True)
                    config = {**config, calibration["key"]: calibration["value"]}
            rows[name] = {"skipped": reason} if reason else bench_codec(dev, img, name, config, work, args)
            if calibration is not None:  # the rate the row reached, from its stored bytes
                rows[name]["target_bpp"] = calibration["target_bpp"]
                rows[name]["bpp_over_target"] = round(measure.bpp(rows[name]["stored_bytes"], img.size)
                                                      / calibration["target_bpp"], 4)
            print(json.dumps({name: {k: v for k, v in rows[name].items() if k != "config"}}), flush=True)
            save()
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
