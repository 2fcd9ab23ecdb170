"""The ``visemz`` command, over the public API only.

Exit codes: 0 everything succeeded; 1 some items failed (each is reported); 2 the command
could not run at all (bad arguments or settings, unreadable or empty source, a destination
inside its source, unusable device), said in one line, before any file is touched.

The command answers at once: this module loads neither torch nor CompressAI.  ``--help``, usage
errors, ``version`` and ``info`` never need them; the commands that compress or decompress import
the codec when they run.  ``--json`` prints strict JSON (no ``Infinity``: a PSNR of identical
images is the string "inf") on standard output and the summary line on standard error.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from . import __version__, defaults
from .config import MAX_REFINE, MAX_STREAMS, check_steps
from .errors import InvalidArgumentError, VisemzError
from .io import files
from .io.writers import to_json
from .models.registry import DEFAULT_MODEL, DEFAULT_QUALITY, QUALITY_MAX, QUALITY_MIN, check_quality


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


def _refine_steps(value: Optional[int]) -> Optional[int]:
    """--refine's range, checked while parsing (a usage error naming the value, before torch loads)."""
    try:
        return None if value is None else check_steps(value)
    except InvalidArgumentError as e:
        raise typer.BadParameter(str(e)) from None


def _quality(value: float) -> float:
    """--quality's range, checked while parsing (a usage error naming the value, NaN included)."""
    try:
        return check_quality(value)
    except InvalidArgumentError as e:
        raise typer.BadParameter(str(e)) from None


def _say(line: str) -> None:
    typer.echo(line, err=True)


# ------------------------------------------------------------------ reports
def _summary_line(d: dict) -> str:
    why = ", ".join(f"{n} {reason}" for reason, n in d["redone"].items())
    return (f"{d['done']} done" + (f" (made again: {why})" if why else "")
            + f", {d['skipped']} skipped (up to date), {d['failed']} failed in {d['seconds']} s"
            + (f"; {d['images_per_s']} images/s, {d['MB_per_s']} MB/s" if d["done"] else "")
            + (f"; ratio {d['ratio']}, {d['bpp']} bpp" if d["ratio"] else ""))


def _report(summary, as_json: bool) -> None:
    d = summary.to_dict()
    if as_json:
        typer.echo(to_json(d))
        _say(_summary_line(d))
    else:
        typer.echo(_summary_line(d))
        for e in d["errors"]:
            _say(f"  failed: {e['file']}: {e['error']}")
        for r in d["redone_files"]:
            _say(f"  made again: {r['file']}: {r['reason']}")
    for n in d["notes"]:
        _say(f"  note: {n}")
    if d["warnings"]:
        _say(f"visemz: warning: {d['warnings'][0]}")
    raise typer.Exit(1 if d["failed"] else 0)


def _progress(label: str, quiet: bool, vsz_in: bool = False):
    from contextlib import nullcontext

    from .pipeline.progress import Progress

    return nullcontext() if quiet else Progress(label, "bytes_out" if vsz_in else "bytes_in")


# ------------------------------------------------------------------ compress / decompress
@app.command()
def compress(
    src: Path = typer.Argument(..., help="an image file or a folder (walked recursively)"),
    dst: Path = typer.Argument(..., help="output folder, outside SRC; a/b/c.tif becomes DST/a/b/c.tif.vsz"),
    model: str = typer.Option(DEFAULT_MODEL, help="balle2016 or mbt2018-mean"),
    quality: float = typer.Option(DEFAULT_QUALITY, callback=_quality,
                                  help=f"{QUALITY_MIN:g}-{QUALITY_MAX:g} on CompressAI's lambda ladder; fractions "
                                       "lie between"),
    max_error: Optional[float] = typer.Option(None, "--max-error",
                                              help="guaranteed max error in levels of the input dtype (absolute for "
                                              "float32; 0: lossless); without it the error is not bounded"),
    entropy: str = typer.Option("zstd", help="zstd, ans (GPU only) or none"),
    streams: int = typer.Option(0, min=0, max=MAX_STREAMS,
                                help="parallel workers, each with its own CUDA stream on a GPU (0: automatic; on a CPU "
                                     "as many as the memory there is holds)"),
    processes: int = typer.Option(0, min=0, max=64, help="worker processes, each a shard of the folder and its own "
                                                          "streams, on GPU rank mod count (0: VISEMZ_PROCESSES, "
                                                          "else 1)"),
    loader: Optional[str] = typer.Option(None, help="auto, dali, kvikio or cpu (default: VISEMZ_LOADER, else auto)"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)"),
    no_resume: bool = typer.Option(False, "--no-resume", help="make again the outputs that are current"),
    tile: int = typer.Option(0, min=0, help="core tile size in pixels, a multiple of 64 (0: VISEMZ_TILE); "
                                            "larger images are compressed tile by tile"),
    refine: Optional[int] = typer.Option(None, "--refine", callback=_refine_steps,
                                         help=f"encoder-side latent refinement steps, 0-{MAX_REFINE} (default: "
                                              "VISEMZ_REFINE, else 0): slower encoding, smaller files at "
                                              "the same quality, the same decoder"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress"),
) -> None:
    """Compress images into .vsz files, mirroring the source tree (a large TIFF or .npy: tile by tile).

    A rerun makes what is missing, changed at its source or made with other settings; never over another's file."""
    from .pipeline.settings import CompressConfig, check_compress

    cfg = CompressConfig(model, quality, max_error, entropy, device, streams, not no_resume, loader or "", tile, refine)
    resolved = check_compress(cfg)  # before the codec loads: a bad setting is one message, exit 2
    files.check_source(src, dst, *files.IMAGES)
    from .pipeline import jobs

    rank, world = _torchrun_group(resolved)
    workers = processes or defaults.get("processes")
    if workers > 1 and world > 1:
        _say(f"visemz: --processes {workers} ignored under torchrun: its {world} ranks are the processes")
    if workers > 1 and world == 1:  # this process starts the ranks (under torchrun, torchrun did)
        from .pipeline.processes import run as processes_run

        jobs.check_settings(cfg)  # refused here, before any worker starts
        summary = processes_run(workers, jobs.compress_folder, src, dst, cfg, device=resolved)
    else:
        with _progress("compress", quiet or rank > 0) as progress:
            summary = jobs.compress_folder(src, dst, cfg, progress=progress, rank=rank, world=world)
    if rank > 0:  # rank 0 prints the whole run; the others only signal their own failures
        raise typer.Exit(1 if summary.failed else 0)
    _report(summary, as_json)


def _torchrun_group(device: str) -> tuple[int, int]:
    """Under torchrun: join the job's group (Gloo carries the manifest) and pick this rank's GPU."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return 0, 1
    import torch.distributed as dist

    if device == "cuda":
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
    from .device import use_gpu

    return use_gpu(int(os.environ.get("LOCAL_RANK", "0")), share)


@app.command()
def decompress(
    src: Path = typer.Argument(..., help="a .vsz file or a folder of them"),
    dst: Path = typer.Argument(..., help="output folder, outside SRC"),
    format: str = typer.Option("auto", "--format", help="auto (each file back in its source's type: PNG, TIFF or "
                                                        ".npy, PNG for any other), png, tiff or npy"),
    device: Optional[str] = typer.Option(None),
    streams: int = typer.Option(0, min=0, max=MAX_STREAMS,
                                help="parallel workers, each with its own CUDA stream on a GPU (0: automatic)"),
    writer: str = typer.Option("auto", help="auto, kvikio (.npy straight from GPU memory) or posix"),
    region: Optional[str] = typer.Option(None, "--region", help="y0:y1,x0:x1: write only that window of each "
                                                                 "image (of every page of a stack)"),
    no_resume: bool = typer.Option(False, "--no-resume", help="make again the outputs that are current"),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress"),
) -> None:
    """Decompress .vsz files, restoring each image's dtype and shape (or only a region of it)."""
    from .pipeline.settings import DecompressConfig, check_decompress

    cfg = DecompressConfig(format, device, streams, writer, _region(region) if region is not None else None,
                           not no_resume)
    check_decompress(cfg)
    files.check_source(src, dst, *files.VSZ_FILES)
    from .pipeline import jobs

    with _progress("decompress", quiet, vsz_in=True) as progress:
        summary = jobs.decompress_folder(src, dst, cfg, progress)
    _report(summary, as_json)


def _region(text: str) -> tuple[int, int, int, int]:
    """"y0:y1,x0:x1" -> (y0, y1, x0, x1); the codec checks it against each image."""
    try:
        (y0, y1), (x0, x1) = (tuple(int(v) for v in part.split(":")) for part in text.split(","))
    except ValueError:
        raise InvalidArgumentError(f"--region {text!r}: expected y0:y1,x0:x1 (integers)") from None
    return y0, y1, x0, x1


# ------------------------------------------------------------------ info / verify
@app.command()
def info(
    path: Path = typer.Argument(..., help="a .vsz file or a folder of them"),
    as_json: bool = typer.Option(False, "--json", help="JSON on standard output (the summary line on standard error)"),
) -> None:
    """Show .vsz files' headers, section sizes, ratio and bpp."""
    if path.is_dir():
        found = files.discover(path, suffix=files.SUFFIX)
        if not found:
            raise InvalidArgumentError(f"no .vsz files in '{files.shown(path)}'")
        rows = [_described(p, path) for p in found]
    elif path.exists():
        rows = [_described(path, None)]
        if "error" in rows[0]:
            raise VisemzError(rows[0]["error"])
    else:
        raise InvalidArgumentError(f"'{files.shown(path)}' is neither a file nor a folder")
    good = [r for r in rows if "error" not in r]
    total, pixels = sum(r["bytes"] for r in good), sum(r.get("pixels", 0) for r in good)
    line = (f"{len(good)} file(s), {total} bytes" + (f", {8 * total / pixels:.4f} bpp" if pixels else "")
            + (f"; {len(rows) - len(good)} unreadable" if len(good) < len(rows) else ""))
    if as_json:
        typer.echo(to_json(rows[0] if not path.is_dir() else {"files": rows, "summary": line}))
        _say(line)
    else:
        for r in rows:
            typer.echo(_info_text(r))
        if path.is_dir():
            typer.echo(line)
    raise typer.Exit(1 if len(good) < len(rows) else 0)


def _described(p: Path, root: Path | None) -> dict:
    """One .vsz file's header, section sizes, ratio and bpp (its pixels: the whole file's)."""
    from . import container, measure

    name = files.shown(p.relative_to(root).as_posix() if root is not None else p)
    try:
        data = p.read_bytes()
        c = container.unpack(data)
    except OSError as e:
        return {"file": name, "error": f"cannot read {name!r}: {e.strerror}"}
    except VisemzError as e:
        return {"file": name, "error": f"{name}: {e}"}
    out = {"file": name, "bytes": len(data), "kind": c.kind, "meta": c.meta,
           "sections": {k: len(v) for k, v in c.sections.items()}}
    shape, paged = c.meta.get("shape"), c.kind == "pages"
    if c.kind in ("image", "pages") and isinstance(shape, list) and len(shape) - paged in (2, 3) \
            and all(isinstance(s, int) and s > 0 for s in shape):
        raw = math.prod(shape) * {"uint8": 1, "uint16": 2, "int16": 2, "float32": 4}.get(c.meta.get("dtype"), 1)
        pixels = measure.pixel_count(shape, paged)
        out.update(pixels=pixels, bpp=round(measure.bpp(len(data), pixels), 4), ratio=round(raw / len(data), 3))
    return out


def _info_text(r: dict) -> str:
    if "error" in r:
        return f"{r['file']}: error: {r['error']}"
    m = r["meta"]
    shape = "x".join(str(s) for s in m.get("shape") or []) or "?"
    lossy = "lossless" if m.get("max_error") == 0 else f"max error {m['max_error']}" if m.get("max_error") is not None \
        else "lossy (error not bounded)"
    figures = f", {r['bpp']} bpp, ratio {r['ratio']}" if "bpp" in r else ""
    what = f"{m.get('model')} quality {m.get('quality')}, {lossy}, " if r["kind"] == "image" else ""
    sections = ", ".join(f"{k} {v}" for k, v in r["sections"].items())
    return (f"{r['file']}: {r['kind']} {shape} {m.get('dtype')}, {what}{r['bytes']} bytes{figures}\n"
            f"  sections: {sections}")


@app.command()
def verify(
    src: Path = typer.Argument(..., help="the source images (a file or a folder)"),
    dst: Path = typer.Argument(..., help="the folder their .vsz files were written to"),
    device: Optional[str] = typer.Option(None),
    as_json: bool = typer.Option(False, "--json",
                                 help="JSON rows on standard output (the summary line on standard error)"),
) -> None:
    """Decode the outputs in DST of the images in SRC and compare: PSNR and max error.

    PSNR is measured against the data's own peak (e.g. 4095 for 12-bit data in 16-bit files), which each row names."""
    from .pipeline import jobs

    rows = jobs.verify(src, dst, device)
    line = _verify_line(rows)
    if as_json:
        typer.echo(to_json(rows))
        _say(line)
    else:
        for r in rows:
            typer.echo(f"{r['file']}: error: {r['error']}" if "error" in r else
                       f"{r['file']}: PSNR {r['psnr']} dB (peak {r['peak']:g}), max error {r['max_error']:g}, "
                       f"{r['bytes']} bytes")
        typer.echo(line)
    raise typer.Exit(1 if any("error" in r for r in rows) else 0)


def _verify_line(rows: list[dict]) -> str:
    good = [r for r in rows if "error" not in r]
    if not good:
        return f"0 verified, {len(rows)} failed"
    psnrs = [math.inf if r["psnr"] == "inf" else r["psnr"] for r in good]
    return (f"{len(good)} verified, {len(rows) - len(good)} failed; lowest PSNR {min(psnrs)} dB, "
            f"largest max error {max(r['max_error'] for r in good):g}")


# ------------------------------------------------------------------ stack
@app.command("stack")
def stack_cmd(
    folder: Path = typer.Argument(..., help="folder of frames (same shape)"),
    out: Path = typer.Option(..., "--out", help="stacked image (float32 TIFF); a .json report goes beside it"),
    error_bound: float = typer.Option(1e-4, "--error-bound", help="relative to the partial sums' value range"),
    algorithm: str = typer.Option("auto", help="auto, ring, recursive_doubling or plain"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda"),
) -> None:
    """Sum frames across ranks (run under torchrun) with a compressed all_reduce."""
    from .cuda import resolve

    dev = resolve(device)
    import torch
    import torch.distributed as dist

    from .collectives.stacking import StackConfig, stack

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
            typer.echo(to_json(report))
            _say(f"stacked {report['frames']} frames on {report['ranks']} rank(s) with {report['algorithm']}: "
                 f"max error {report['max_abs_error']:.3g} (bound {report['bound_total']:.3g}), PSNR "
                 f"{report['psnr_db']:.2f} dB; {files.shown(out)} and its .json report")
    finally:
        if started:
            dist.destroy_process_group()


# ------------------------------------------------------------------ demo, version, ints-info, eval
SAMPLES = ("camera.png", "astronaut.png", "coins.png", "moon.png", "cell.png", "hubble_deep_field.jpg", "page.png",
           "coffee.png")


@app.command()
def demo(
    out: Optional[Path] = typer.Option(None, help="a new (or empty) folder for the outputs (default: a new "
                                                  "folder visemz-demo, -2, -3, ... in the current folder)"),
    device: Optional[str] = typer.Option(None),
) -> None:
    """The main job on scikit-image's sample images: compress, verify, decompress; says where the outputs are."""
    from .cuda import resolve

    dev = resolve(device)
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgumentError(f"--out '{files.shown(out)}' exists and is not an empty folder")
    import skimage.data

    from .pipeline import jobs

    out = (out or _new_folder(Path("visemz-demo"))).absolute()
    samples, compressed, restored = out / "samples", out / "compressed", out / "restored"
    samples.mkdir(parents=True, exist_ok=True)
    data_dir = Path(skimage.data.__file__).parent
    for name in SAMPLES:
        if (data_dir / name).is_file():
            shutil.copy(data_dir / name, samples / name)
    summary = jobs.compress_folder(samples, compressed, jobs.CompressConfig(device=dev, resume=False))
    d = summary.to_dict()
    typer.echo(f"compressed {d['done']} sample images from scikit-image ({d['bytes_in']} -> {d['bytes_out']} bytes, "
               f"ratio {d['ratio']}, {d['bpp']} bpp) in {d['seconds']} s on {dev}")
    for row in jobs.verify(samples, compressed, dev):
        typer.echo(f"  {row['file']}: PSNR {row.get('psnr')} dB, max error {row.get('max_error')}")
    back = jobs.decompress_folder(compressed, restored, jobs.DecompressConfig(device=dev))
    typer.echo(f"outputs in {files.shown(out)}:\n  {files.shown(samples)}  the sample images (the inputs)\n"
               f"  {files.shown(compressed)}  their .vsz files and visemz-manifest.json\n"
               f"  {files.shown(restored)}  the images decoded from the .vsz files")
    raise typer.Exit(1 if d["failed"] or back.failed else 0)


def _new_folder(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ...: the first that does not exist."""
    k, path = 1, base
    while path.exists() or path.is_symlink():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


@app.command()
def version() -> None:
    """Print the visemz version."""
    typer.echo(__version__)


@app.command("ints-info")
def ints_info(path: Path) -> None:
    """Describe an ints stream written by visemz.encoders.encode_ints."""
    from .encoders import stream

    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read '{files.shown(path)}': {e.strerror}") from None
    parsed = stream.parse(data)
    typer.echo(json.dumps({"entropy": parsed.entropy, "raw_size": parsed.raw_size, "frames": len(parsed.frames)}))


# CompressAI imports torch_geometric, whose import calls torch.jit.script: torch's deprecation warning of it would
# print on every command that loads the codec, and in every worker process, about no code of the user's
DEPRECATED_JIT = "`torch.jit.script` is deprecated"
QUIET = f"ignore:{DEPRECATED_JIT}:FutureWarning"


def main() -> None:
    """The console script: exit 0 when everything succeeded, 1 when some items failed, 2 on a
    usage error (typer's own for bad arguments, ``_Commands`` for a ``VisemzError``), 130 when
    interrupted.  The command owns its process, so it sets the warnings filters (QUIET, here and for the
    processes it spawns); a library import leaves them to the caller."""
    warnings.filterwarnings("ignore", message=DEPRECATED_JIT, category=FutureWarning)
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), QUIET]))
    try:
        app(prog_name="visemz")
    except KeyboardInterrupt:
        print("visemz: interrupted", file=sys.stderr)
        sys.exit(130)


@app.command("eval")
def eval_cmd(
    folder: Path = typer.Argument(..., help="a folder of images, or of sub-folders of images (one dataset each)"),
    codecs: Optional[str] = typer.Option(None, help="comma-separated codec names (default: every codec usable on the "
                                                    "device)"),
    out: Path = typer.Option(Path("report"), "--out",
                             help="report folder: points.csv, summary.md, rd_*.png, crops_*.png"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)"),
    limit: Optional[int] = typer.Option(None, help="first N images of each dataset"),
    datasets: Optional[str] = typer.Option(None, help="comma-separated sub-folder names (default: all)"),
    no_crops: bool = typer.Option(False, "--no-crops", help="skip the matched-bpp crop figures"),
    crop: Optional[int] = typer.Option(None, "--crop", help="code each image's central N x N pixels"),
    gray: bool = typer.Option(False, "--gray", help="code each image's luma"),
    refine_steps: int = typer.Option(0, "--refine-steps",
                                     help="also run visemz-<arch>-refine<N> (N steps of encoder-side latent "
                                          "refinement) beside each visemz-<arch> codec (default 0: none)"),
    ladder: Optional[list[str]] = typer.Option(None, "--ladder", metavar="CODEC=V1,V2,...",
                                               help="replace a codec's settings (qualities of the learned codecs, "
                                                    "maximum errors of the error-bounded ones), e.g. "
                                                    "visemz-mbt2018-mean-refine100=1,2,4,8; repeatable"),
) -> None:
    """Rate-distortion, lossless and near-lossless evaluation against the classical, scientific and CompressAI
    codecs (resumable)."""
    from .cuda import resolve
    from .evaluation.runner import EvalConfig, evaluate, parse_ladder

    def names(s: Optional[str]):
        return tuple(n.strip() for n in s.split(",") if n.strip()) if s else None

    cfg = EvalConfig(codecs=names(codecs), device=resolve(device), limit=limit, datasets=names(datasets),
                     crops=not no_crops, refine_steps=refine_steps, crop=crop, gray=gray,
                     ladders=tuple(parse_ladder(t) for t in ladder or ()))
    result = evaluate(folder, out, cfg, log=lambda m: typer.echo(m, err=True))
    again = f" ({result.recomputed} of them again: their codec had changed)" if result.recomputed else ""
    typer.echo(f"{result.computed} points computed{again}, {result.skipped} already in {result.csv}, "
               f"{len(result.failures)} failed; report in {out}")
    raise typer.Exit(1 if result.failures else 0)
