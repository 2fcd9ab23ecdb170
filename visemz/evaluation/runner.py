"""The resumable evaluation run: every (dataset, image, codec, setting) point into one CSV.

A dataset is FOLDER itself when it holds images, and each sub-folder that holds images
(``eval/kodak``, ``eval/xray``); with ``crop`` / ``gray`` its images are central crops / gray
conversions, and its name says so (``datasets.View``).  Points already in ``OUT/points.csv`` are skipped, so a
killed run picks up where it stopped; the CSV is rewritten atomically after each
(image, codec), so it never holds a partial row.  Each point records its codec's identity (``Codec.identity``:
library versions, a learned codec's weights): a point whose codec has changed since (an upgrade, other
weights) is computed again and replaced, never mixed with the new ones.  Points of a CSV written before
identities were recorded (an empty ``codec_id``) are kept as they are.
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InvalidArgumentError, VisemzError
from ..image.refine import check_steps as check_refine
from ..io.writers import write_atomic
from . import codecs as codec_registry
from . import metrics, report
from .codecs import Codec, Layout
from .datasets import View, find_datasets
from .datasets import load as load_view

CSV_NAME = "points.csv"
KEY = ("dataset", "image", "codec", "setting")
IDENTITY = "codec_id"
COLUMNS = KEY + ("value", "kind", "device", "height", "width", "channels", "bytes", "bpp", "psnr", "ssim", "ms_ssim",
                 "gmsd", "max_abs_error", "encode_s", "decode_s", IDENTITY)


@dataclass(frozen=True)
class EvalConfig:
    codecs: tuple[str, ...] | None = None  # None: every codec that runs on ``device``
    device: str = "cpu"
    limit: int | None = None  # first N images of each dataset
    datasets: tuple[str, ...] | None = None  # None: every dataset found
    ladders: tuple[tuple[str, tuple], ...] = ()  # per-codec ladder overrides, e.g. (("jpeg", (10, 50)),)
    crops: bool = True  # draw the matched-bpp crop figure per dataset
    #: with N > 0, codec visemz-<arch>-refine<N> (N steps of encoder-side latent refinement) runs
    #: beside each visemz-<arch> of the selection
    refine_steps: int = 0
    crop: int | None = None  # code each image's central crop x crop pixels
    gray: bool = False  # code each image's luma

    def __post_init__(self):
        check_refine(self.refine_steps)
        View(self.crop, self.gray)  # checks crop

    @property
    def view(self) -> View:
        return View(self.crop, self.gray)

    def codec_names(self) -> tuple[str, ...]:
        names = self.codecs if self.codecs is not None else codec_registry.default_names(self.device)
        return codec_registry.with_refined(names, self.refine_steps)


def parse_ladder(text: str) -> tuple[str, tuple]:
    """'CODEC=V1,V2,...' (``visemz eval --ladder``) -> (CODEC, (V1, V2, ...)): whole numbers as int, others as
    float; an ``EvalConfig.ladders`` entry."""
    name, sep, values = text.partition("=")
    try:
        nums = tuple(float(v) for v in values.split(","))
    except ValueError:
        nums = ()
    if not sep or not name or not nums:
        raise InvalidArgumentError(f"--ladder {text!r}: expected CODEC=V1,V2,... with numbers")
    return name, tuple(int(v) if v.is_integer() else v for v in nums)


@dataclass
class RunResult:
    csv: Path
    computed: int = 0
    skipped: int = 0
    recomputed: int = 0  # of the computed: points the CSV held from a codec since changed
    failures: list[str] = field(default_factory=list)


def build_codecs(cfg: EvalConfig) -> list[Codec]:
    return codec_registry.build_many(cfg.codec_names(), cfg.device, dict(cfg.ladders))


def read_points(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(rows[0]) not in (set(COLUMNS), set(COLUMNS) - {IDENTITY}):
        raise InvalidArgumentError(f"{str(path)!r} has columns {list(rows[0])}, not those of an evaluation CSV")
    return [{IDENTITY: "", **r} for r in rows]  # a CSV from before identities: none recorded


def write_points(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_atomic(path, buf.getvalue().encode())


def _timed(fn, sync):
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def measure_point(codec: Codec, image: np.ndarray, setting, device: str) -> dict:
    """Encode, decode and score one image at one setting."""
    layout = Layout.of(image)
    data, t_enc = _timed(lambda: codec.encode(image, setting), codec.sync)
    rec, t_dec = _timed(lambda: codec.decode(data, setting, layout), codec.sync)
    row = metrics.measure(image, rec, len(data), device)
    return {"bytes": len(data), **row, "encode_s": t_enc, "decode_s": t_dec}


def _format(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def check_out(folder: Path, out: Path) -> None:
    """The report folder, before any point runs: a folder (or a new path) outside the images' folder, whose images a
    later run would otherwise evaluate with the report's figures among them."""
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(f"out '{out}' is a file: the report is a folder")
    where, images = out.resolve(), folder.resolve()
    if where == images or images in where.parents:
        raise InvalidArgumentError(f"out '{out}' lies in the images' folder '{folder}': name a folder outside it")


def run_points(folder: Path, out: Path, cfg: EvalConfig, log: Callable[[str], None] = print) -> RunResult:
    """Compute every missing point; return what was computed, skipped and failed."""
    datasets = find_datasets(folder, cfg.datasets, cfg.limit, cfg.view)
    codecs = build_codecs(cfg)
    path = out / CSV_NAME
    rows = {tuple(r[k] for k in KEY): r for r in read_points(path)}  # key -> row, in the CSV's order
    result, warmed = RunResult(path), set()
    identities: dict[tuple, str] = {}  # per codec and kind of image, once a run: it hashes weights files
    for ds, paths in datasets.items():
        for p in paths:
            try:
                image = load_view(p, cfg.view)
                metrics.check_dtype(image.dtype)
            except VisemzError as e:
                result.failures.append(f"{ds}/{p.name}: {e}")
                log(f"skipped {ds}/{p.name}: {e}")
                continue
            layout = Layout.of(image)
            for codec in codecs:
                why_not = codec.supports(layout)
                if why_not:
                    continue
                kind = (codec.name, layout.channels, layout.dtype)  # what an identity may depend on, not the size
                if kind not in identities:
                    identities[kind] = codec.identity(layout)
                identity = identities[kind]
                held = {s: rows.get((ds, p.name, codec.name, codec.label(s))) for s in codec.ladder}
                todo = [s for s, r in held.items() if r is None or r[IDENTITY] not in ("", identity)]
                result.skipped += len(codec.ladder) - len(todo)
                if not todo:
                    continue
                stale = sum(held[s] is not None for s in todo)
                if stale:
                    log(f"{ds}/{p.name} {codec.name}: {stale} points were computed by another version of the codec "
                        f"(now {identity!r}): computing them again")
                if (codec.name, layout.channels) not in warmed:  # keep loading (a model per variant) out of the timings
                    codec.warm_up(image, todo[0])
                    warmed.add((codec.name, layout.channels))
                t0 = time.perf_counter()
                for s in todo:
                    try:
                        m = measure_point(codec, image, s, cfg.device)
                    except Exception as e:  # a codec library failing on one point must not stop the run
                        result.failures.append(f"{ds}/{p.name} {codec.name} {codec.label(s)}: {type(e).__name__}: {e}")
                        log(f"failed {ds}/{p.name} {codec.name} {codec.label(s)}: {type(e).__name__}: {e}")
                        continue
                    key = (ds, p.name, codec.name, codec.label(s))
                    result.recomputed += key in rows
                    rows[key] = {k: _format(v) for k, v in {
                        "dataset": ds, "image": p.name, "codec": codec.name, "setting": codec.label(s),
                        "value": float(s), "kind": codec.kind, "device": codec.device, "height": layout.shape[0],
                        "width": layout.shape[1], "channels": layout.channels, **m, IDENTITY: identity}.items()}
                    result.computed += 1
                write_points(path, list(rows.values()))
                log(f"{ds}/{p.name} {codec.name}: {len(todo)} points in {time.perf_counter() - t0:.2f} s")
    if not path.exists():
        write_points(path, list(rows.values()))
    return result


def evaluate(folder: Path, out: Path, cfg: EvalConfig, log: Callable[[str], None] = print) -> RunResult:
    """Run (or resume) the points, then write the BD tables, plots and summary into ``out``."""
    check_out(folder, out)
    result = run_points(folder, out, cfg, log)
    report.write_report(folder, out, cfg, read_points(result.csv), result.failures, log)
    return result
