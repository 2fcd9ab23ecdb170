"""The ``visemz`` command, over the public API only.

Exit codes: 0 everything succeeded; 1 some items failed (each is reported); 2 the command
could not run at all (bad arguments, unreadable source, unusable device).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import skimage.data
import torch
import torch.distributed as dist
import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from . import __version__, container, measure
from .collectives.stacking import StackConfig, stack
from .device import resolve, use_gpu
from .encoders import stream
from .errors import InvalidArgumentError, VisemzError
from .models.registry import DEFAULT_MODEL, DEFAULT_QUALITY
from .evaluation.runner import EvalConfig, evaluate
from .pipeline.jobs import CompressConfig, DecompressConfig, compress_folder, decompress_folder
from .pipeline.jobs import verify as verify_folder
from .pipeline.processes import run as processes_run
from .config import DEFAULTS
from .refine import check_steps as check_refine
from .tiling import check_tile


class _Commands(TyperGroup):
    """The command group: a ``VisemzError`` (bad input, unusable device) is a usage failure.

    Handled here rather than in ``main`` so that the command behaves the same when run
    in-process (typer's test runner) as when run from the shell."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except VisemzError as e:
            typer.echo(f"visemz: error: {e}", err=True)
            raise typer.Exit(2) from None


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True,
                  help="GPU-first compression for scientific images.")


def _progress(total_hint: str, quiet: bool, vsz_in: bool):
    """A rich progress bar with images/s and MB/s of the image files (the outputs when ``vsz_in``: a
    decompression), or nothing when quiet / not a terminal."""
    if quiet or not sys.stderr.isatty():
        return None, None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} images"),
                   TimeElapsedColumn(), transient=True)
    task = bar.add_task(total_hint, total=None)
    state = {"n": 0, "bytes": 0}
    t0 = time.perf_counter()
    image_side = "bytes_out" if vsz_in else "bytes_in"  # MB/s of image files, as the summary's

    def update(result):
        state["n"] += 1
        state["bytes"] += getattr(result, image_side)
        dt = max(time.perf_counter() - t0, 1e-9)
        bar.update(task, advance=1, description=f"{total_hint} {state['n'] / dt:.1f} img/s {state['bytes'] / 1e6 / dt:.1f} MB/s")

    return bar, update


def _report(summary, as_json: bool) -> None:
    d = summary.to_dict()
    if as_json:
        typer.echo(json.dumps(d, indent=1))
    else:
        typer.echo(f"{d['done']} done, {d['skipped']} skipped, {d['failed']} failed in {d['seconds']} s"
                   + (f"; {d['images_per_s']} images/s, {d['MB_per_s']} MB/s" if d["done"] else "")
                   + (f"; ratio {d['ratio']}, {d['bpp']} bpp" if d["ratio"] else ""))
        for e in d["errors"]:
            typer.echo(f"  failed: {e['file']}: {e['error']}", err=True)
    raise typer.Exit(1 if d["failed"] else 0)


def _run_with_progress(label: str, quiet: bool, job, vsz_in: bool = False):
    bar, update = _progress(label, quiet, vsz_in)
    if bar is None:
        return job(None)
    with bar:
        return job(update)


@app.command()
def compress(
    src: Path = typer.Argument(..., help="an image file or a folder (walked recursively)"),
    dst: Path = typer.Argument(..., help="output folder; a/b/c.tif becomes DST/a/b/c.tif.vsz"),
    model: str = typer.Option(DEFAULT_MODEL, help="balle2016 or mbt2018-mean"),
    quality: float = typer.Option(DEFAULT_QUALITY, min=1.0, max=8.0,
                                  help="1-8 on CompressAI's lambda ladder; fractions lie between"),
    max_error: Optional[float] = typer.Option(None, "--max-error", help="guaranteed max error in levels of the input dtype (absolute for float32; 0: lossless)"),
    entropy: str = typer.Option("zstd", help="zstd, ans (GPU only) or none"),
    streams: int = typer.Option(0, min=0, help="parallel workers, each with its own CUDA stream on a GPU (0: automatic)"),
    processes: int = typer.Option(0, min=0, max=64, help="worker processes, each a shard of the folder and its own "
                                                          "streams, on GPU rank mod count (0: VISEMZ_PROCESSES, else 1)"),
    loader: Optional[str] = typer.Option(None, help="auto, dali, kvikio or cpu (default: VISEMZ_LOADER, else auto)"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)"),
    no_resume: bool = typer.Option(False, "--no-resume", help="recompress outputs that are already complete"),
    tile: int = typer.Option(0, min=0, help="core tile size in pixels, a multiple of 64 (0: VISEMZ_TILE); "
                                            "larger images are compressed tile by tile"),
    refine: Optional[int] = typer.Option(None, "--refine",
                                         help="encoder-side latent refinement steps, 0-10000 (default: "
                                              "VISEMZ_REFINE, else 0): slower encoding, smaller files at "
                                              "the same quality, the same decoder"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Compress images into .vsz files, mirroring the source tree (a large TIFF or .npy: tile by tile)."""
    rank, world = _torchrun_group(device)
    if tile:
        check_tile(tile, "--tile")  # before any output: a bad size is a usage error, not a failure per image
    if refine is not None:
        check_refine(refine)
    cfg = CompressConfig(model, quality, max_error, entropy, device, streams, not no_resume, loader or "", tile,
                         refine)
    workers = processes or DEFAULTS.processes
    if workers > 1 and world > 1:
        typer.echo(f"visemz: --processes {workers} ignored under torchrun: its {world} ranks are the processes",
                   err=True)
    if workers > 1 and world == 1:  # this process starts the ranks (under torchrun, torchrun did)
        summary = processes_run(workers, compress_folder, src, dst, cfg, device=resolve(device))
    else:
        summary = _run_with_progress("compress", as_json or rank > 0,
                                     lambda p: compress_folder(src, dst, cfg, progress=p, rank=rank, world=world))
    if rank > 0:  # rank 0 prints the whole run; the others only signal their own failures
        raise typer.Exit(1 if summary.failed else 0)
    _report(summary, as_json)


def _torchrun_group(device: Optional[str]) -> tuple[int, int]:
    """Under torchrun: join the job's group (Gloo carries the manifest) and pick this rank's GPU."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return 0, 1
    if device != "cpu" and torch.cuda.is_available():
        _use_local_gpu(share=True)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def _use_local_gpu(share: bool = False) -> int:
    """Make torchrun's LOCAL_RANK this process's GPU (torch and cupy); returns its index.

    Without it every rank lands on GPU 0, and NCCL refuses two ranks on one device.  ``share``: more
    ranks than GPUs take them in turn (rank r the GPU r mod count), for folder jobs (Gloo only), where
    several processes on one GPU each bring their own Python to the host work that one process's
    streams share under its interpreter lock."""
    return use_gpu(int(os.environ.get("LOCAL_RANK", "0")), share)


@app.command()
def decompress(
    src: Path = typer.Argument(..., help="a .vsz file or a folder of them"),
    dst: Path = typer.Argument(..., help="output folder"),
    format: str = typer.Option("png", "--format", help="png, tiff or npy (multi-page files: tiff or npy)"),
    device: Optional[str] = typer.Option(None),
    streams: int = typer.Option(0, min=0, help="parallel workers, each with its own CUDA stream on a GPU (0: automatic)"),
    writer: str = typer.Option("auto", help="auto, kvikio (.npy straight from GPU memory) or posix"),
    region: Optional[str] = typer.Option(None, "--region", help="y0:y1,x0:x1: write only that window of each "
                                                                 "image (of every page of a stack)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Decompress .vsz files, restoring each image's dtype and shape (or only a region of it)."""
    if format not in ("png", "tiff", "npy"):
        raise typer.BadParameter(f"{format!r}: expected png, tiff or npy", param_hint="--format")
    cfg = DecompressConfig(format, device, streams, writer, _region(region) if region is not None else None)
    summary = _run_with_progress("decompress", as_json, lambda p: decompress_folder(src, dst, cfg, p), vsz_in=True)
    _report(summary, as_json)


def _region(text: str) -> tuple[int, int, int, int]:
    """"y0:y1,x0:x1" -> (y0, y1, x0, x1); the codec checks it against each image."""
    try:
        (y0, y1), (x0, x1) = (tuple(int(v) for v in part.split(":")) for part in text.split(","))
    except ValueError:
        raise InvalidArgumentError(f"--region {text!r}: expected y0:y1,x0:x1 (integers)") from None
    return y0, y1, x0, x1


@app.command()
def info(file: Path) -> None:
    """Show a .vsz file's header, section sizes, ratio and bpp."""
    try:
        data = file.read_bytes()
    except OSError as e:
        raise VisemzError(f"cannot read {str(file)!r}: {e.strerror}") from None
    c = container.unpack(data)
    out = {"file": str(file), "bytes": len(data), "kind": c.kind, "meta": c.meta,
           "sections": {k: len(v) for k, v in c.sections.items()}}
    meta = c.meta
    shape = meta.get("shape")
    paged = c.kind == "pages"
    if c.kind in ("image", "pages") and isinstance(shape, list) and len(shape) - paged in (2, 3) \
            and all(isinstance(s, int) and s > 0 for s in shape):
        raw = math.prod(shape) * {"uint8": 1, "uint16": 2, "float32": 4}.get(meta.get("dtype"), 1)
        out.update(bpp=round(measure.bpp(len(data), measure.pixel_count(shape, paged)), 4), ratio=round(raw / len(data), 3))
    typer.echo(json.dumps(out, indent=1))


@app.command()
def verify(src: Path, dst: Path, device: Optional[str] = typer.Option(None)) -> None:
    """Decode the outputs in DST of the images in SRC and compare: PSNR and max error."""
    rows = verify_folder(src, dst, device)
    typer.echo(json.dumps(rows, indent=1))
    raise typer.Exit(1 if any("error" in r for r in rows) else 0)


@app.command("stack")
def stack_cmd(
    folder: Path = typer.Argument(..., help="folder of frames (same shape)"),
    out: Path = typer.Option(..., "--out", help="stacked image (float32 TIFF); a .json report goes beside it"),
    error_bound: float = typer.Option(1e-4, "--error-bound", help="relative to the partial sums' value range"),
    algorithm: str = typer.Option("auto", help="auto, ring, recursive_doubling or plain"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda"),
) -> None:
    """Sum frames across ranks (run under torchrun) with a compressed all_reduce."""
    dev = resolve(device)
    started = not dist.is_initialized()
    if started:
        if "RANK" in os.environ and dev == "cuda":
            dist.init_process_group("nccl", device_id=torch.device("cuda", _use_local_gpu()))
        elif "RANK" in os.environ:
            dist.init_process_group("gloo")
        else:  # a single process without torchrun
            rendezvous = Path(tempfile.mkdtemp()) / "rendezvous"
            dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    try:
        report = stack(folder, out, StackConfig(error_bound, algorithm, dev))
        if report is not None:
            typer.echo(json.dumps(report, indent=1))
    finally:
        if started:
            dist.destroy_process_group()


SAMPLES = ("camera.png", "astronaut.png", "coins.png", "moon.png", "cell.png", "hubble_deep_field.jpg", "page.png", "coffee.png")


@app.command()
def demo(
    out: Optional[Path] = typer.Option(None, help="keep the outputs here (default: a temporary folder)"),
    device: Optional[str] = typer.Option(None),
) -> None:
    """The main job on an embedded default: compress scikit-image's sample images."""
    data_dir = Path(skimage.data.__file__).parent
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "samples"
        src.mkdir()
        for name in SAMPLES:
            if (data_dir / name).is_file():
                shutil.copy(data_dir / name, src / name)
        dst = out or Path(tmp) / "compressed"
        summary = compress_folder(src, dst, CompressConfig(device=device, resume=False))
        d = summary.to_dict()
        typer.echo(f"compressed {d['done']} sample images from scikit-image ({d['bytes_in']} -> {d['bytes_out']} bytes, "
                   f"ratio {d['ratio']}, {d['bpp']} bpp) in {d['seconds']} s on {resolve(device)}")
        for row in verify_folder(src, dst, device):
            typer.echo(f"  {row['file']}: PSNR {row.get('psnr')} dB, max error {row.get('max_error')}")
    raise typer.Exit(1 if d["failed"] else 0)


@app.command()
def version() -> None:
    """Print the visemz version."""
    typer.echo(__version__)


@app.command("ints-info")
def ints_info(path: Path) -> None:
    """Describe an ints stream written by visemz.encoders.encode_ints."""
    parsed = stream.parse(path.read_bytes())
    typer.echo(json.dumps({"entropy": parsed.entropy, "raw_size": parsed.raw_size, "frames": len(parsed.frames)}))


def main() -> None:
    """The console script: exit 0 when everything succeeded, 1 when some items failed, 2 on a
    usage error (typer's own for bad arguments, ``_Commands`` for a ``VisemzError``)."""
    app(prog_name="visemz")


@app.command("eval")
def eval_cmd(
    folder: Path = typer.Argument(..., help="a folder of images, or of sub-folders of images (one dataset each)"),
    codecs: Optional[str] = typer.Option(None, help="comma-separated codec names (default: every codec usable on the device)"),
    out: Path = typer.Option(Path("report"), "--out", help="report folder: points.csv, summary.md, rd_*.png, crops_*.png"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)"),
    limit: Optional[int] = typer.Option(None, help="first N images of each dataset"),
    datasets: Optional[str] = typer.Option(None, help="comma-separated sub-folder names (default: all)"),
    no_crops: bool = typer.Option(False, "--no-crops", help="skip the matched-bpp crop figures"),
    crop: Optional[int] = typer.Option(None, "--crop", help="code each image's central N x N pixels"),
    gray: bool = typer.Option(False, "--gray", help="code each image's luma"),
    refine_steps: int = typer.Option(0, "--refine-steps",
                                     help="also run visemz-<arch>-refine<N> (N steps of encoder-side latent "
                                          "refinement) beside each visemz-<arch> codec (default 0: none)"),
) -> None:
    """Rate-distortion, lossless and near-lossless evaluation against the classical, scientific and CompressAI codecs (resumable)."""
    def names(s: Optional[str]):
        return tuple(n.strip() for n in s.split(",") if n.strip()) if s else None

    cfg = EvalConfig(codecs=names(codecs), device=resolve(device), limit=limit, datasets=names(datasets),
                     crops=not no_crops, refine_steps=refine_steps, crop=crop, gray=gray)
    result = evaluate(folder, out, cfg, log=lambda m: typer.echo(m, err=True))
    typer.echo(f"{result.computed} points computed, {result.skipped} already in {result.csv}, {len(result.failures)} failed; "
               f"report in {out}")
    raise typer.Exit(1 if result.failures else 0)
