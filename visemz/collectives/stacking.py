"""Image stacking: sum a folder of frames across ranks with a compressed all_reduce.

    torchrun --nproc-per-node N -m visemz stack FOLDER --out stacked.tiff --error-bound 1e-4

Each rank loads every N-th frame (sorted file list), sums them in float32 on its device,
and the ranks all_reduce the partial sums with the error-bounded codec.  The error bound is
relative to the value range of the partial sums (as SZ-style compressors define it; the range
is agreed across ranks, so one setting fits any bit depth).
Rank 0 writes the stacked image (float32 TIFF) and a JSON report: PSNR and NRMSE against the
exact stack (a plain all_reduce in float64 of the same partial sums, in the same run), the
time of each phase, and the speedup over a plain float32 all_reduce.  The bound it checks is
W x eb (W ranks) plus the float32 stack's own rounding (half a unit in the last place).  With ``device="cuda"``
(one GPU per rank, NCCL) frames are summed on the GPU and the compressed all_reduce runs
there too.  The compressed all_reduce is timed twice: once as is (its total, for the speedup)
and once with a device sync around each phase (compress, communicate, reduce, decompress).
The report names the algorithm that ran (auto's choice).  The all_reduce runs through a plan
(``plans.plan``: the ranks agree on its settings once, when it is made; ``plan_setup`` in the
report), and a warm-up call before the timing keeps first-use costs (kernel compilation,
connections, auto's calibration) out of it.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
import torch
import torch.distributed as dist

from .. import config, measure
from ..errors import InvalidArgumentError, VisemzError
from ..floats import ErrorBounded
from ..io import files, loaders, writers
from . import transport as T
from .ops import last_algorithm, phase_times
from .plans import plan


@dataclass(frozen=True)
class StackConfig:
    error_bound: float = 1e-4  # relative to the partial sums' value range
    algorithm: str = "auto"
    device: str = "cpu"

    def __post_init__(self):
        bound = self.error_bound
        if not config.real_number(bound) or not (math.isfinite(bound) and bound > 0):
            raise InvalidArgumentError(f"error_bound={self.error_bound!r}: expected a finite number > 0 (relative to "
                                       "the partial sums' value range)")


OUT_SUFFIXES = (".tif", ".tiff")  # the stack is written as a float32 TIFF


def _report_path(out: Path) -> Path:
    return out.with_suffix(out.suffix + ".json")


def _check_out(out: Path) -> None:
    if out.suffix.lower() not in OUT_SUFFIXES:
        raise InvalidArgumentError(f"out '{files.shown(out)}': the stack is a float32 TIFF, name it .tif or .tiff")
    for path in (out, _report_path(out)):
        if path.exists() or path.is_symlink():
            raise InvalidArgumentError(f"out: '{files.shown(path)}' exists; a stack writes new files only (remove "
                                       "it, or name another)")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def stack(folder: Path, out: Path, cfg: StackConfig = StackConfig(), group=None) -> dict | None:
    """Run on every rank of an initialised process group; returns the report on rank 0.  ``out`` must be a new
    .tif or .tiff path (its .json report goes beside it): a stack never replaces a file, the frames least of all."""
    _check_out(out)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    frames = files.discover(folder, files.IMAGE_EXTENSIONS)
    if not frames:
        raise InvalidArgumentError(f"no image frames in {str(folder)!r}")
    t = {"load": 0.0, "sum": 0.0, "compress_communicate_reduce": 0.0, "plain_allreduce": 0.0}
    partial, problem = None, None
    for path in files.shard(frames, rank, world):
        t0 = time.perf_counter()
        try:
            img = loaders.load_image(path)
        except VisemzError as e:
            problem = str(e)
            break
        t["load"] += time.perf_counter() - t0
        if partial is not None and tuple(img.shape) != tuple(partial.shape):
            problem = f"frame '{files.shown(path.name)}' is {img.shape}, the frames before it " \
                      f"{tuple(partial.shape)}: the frames of a stack must share one shape"
            break
        if img.dtype.kind == "f" and not np.isfinite(img).all():
            problem = f"frame '{files.shown(path.name)}' holds NaN or infinite values: a stack sums finite frames"
            break
        t0 = time.perf_counter()
        x = torch.from_numpy(img.astype(np.float32)).to(cfg.device)
        partial = x if partial is None else partial + x
        _sync(cfg.device)
        t["sum"] += time.perf_counter() - t0
    problems: list = [None] * world
    dist.all_gather_object(problems, problem, group)  # a bad frame on one rank stops every rank, with its reason
    if any(problems):
        raise InvalidArgumentError(next(p for p in problems if p))
    comm = T.device(group)  # NCCL groups exchange CUDA tensors, Gloo groups CPU tensors
    shape = torch.tensor(list(partial.shape) if partial is not None else [0, 0], dtype=torch.int64, device=comm)
    everyone = [torch.empty_like(shape) for _ in range(world)]
    dist.all_gather(everyone, shape, group)
    ref_shape = next(s for s in everyone if s[0] > 0)
    if any(s[0] > 0 and not torch.equal(s, ref_shape) for s in everyone):
        raise InvalidArgumentError(f"frames differ in shape across ranks: {[s.tolist() for s in everyone]}")
    if partial is None:  # more ranks than frames
        partial = torch.zeros(tuple(ref_shape.tolist()), dtype=torch.float32, device=cfg.device)

    ends = torch.stack([partial.max(), -partial.min()]).double().to(comm)
    dist.all_reduce(ends, op=dist.ReduceOp.MAX, group=group)  # the partial sums' value range, agreed
    eb = max(cfg.error_bound * float(ends.sum()), 1e-30)  # absolute bound on each rank's partial sum
    exact = partial.double().to(comm)
    dist.all_reduce(exact, group=group)  # the exact stack, for the report
    exact = exact.cpu()

    plain = partial.clone()
    _sync(cfg.device)
    t0 = time.perf_counter()
    dist.all_reduce(plain, group=group)
    _sync(cfg.device)
    t["plain_allreduce"] = time.perf_counter() - t0

    stacked = partial.clone().contiguous()  # stays on cfg.device: GPU frames are reduced on the GPU
    t0 = time.perf_counter()
    reduce = plan(stacked, group=group, codec=ErrorBounded(eb), algorithm=cfg.algorithm)  # settings agreed once, here
    t["plan_setup"] = time.perf_counter() - t0
    # a warm-up call keeps first-use costs out of the timing: kernel compilation, the point-to-point
    # connections, and for auto its calibration (once per setting)
    reduce(partial.clone().contiguous())
    _sync(cfg.device)
    t0 = time.perf_counter()
    reduce(stacked)
    _sync(cfg.device)
    t["compress_communicate_reduce"] = time.perf_counter() - t0
    algorithm = last_algorithm()
    with phase_times() as phases:  # the same call again, with a sync around each phase
        reduce(partial.clone().contiguous())
    stacked = stacked.cpu()

    if rank != 0:
        return None
    err = stacked.double() - exact
    psnr = measure.psnr(exact.numpy(), stacked.numpy())  # peak: the exact stack's value range
    # the bound holds on the float64 reconstruction; the float32 stack adds up to half a unit in the last place
    rounding = float(np.spacing(np.float32(float(exact.abs().max()) + world * eb))) / 2
    bound, max_err = world * eb + rounding, float(err.abs().max())
    report = {
        "frames": len(frames), "ranks": world, "shape": list(stacked.shape),
        "error_bound_relative": cfg.error_bound, "error_bound_absolute_per_rank": eb,
        "max_abs_error": max_err, "float32_rounding": rounding, "bound_total": bound, "within_bound": max_err <= bound,
        "psnr_db": psnr,
        "nrmse": 10 ** (-psnr / 20),  # RMS error over that range
        "algorithm": algorithm,  # what ran (auto's choice)
        "seconds": {k: round(v, 6) for k, v in t.items()},
        "compressed_allreduce_phases_seconds": {k: round(v, 6) for k, v in phases.items()},
        "speedup_over_plain_allreduce": round(t["plain_allreduce"] / max(t["compress_communicate_reduce"], 1e-12), 4),
    }
    if world == 1:
        report["note"] = "one rank: nothing to communicate, so the all_reduce returned its input (plain, phases 0)"
    buf = io.BytesIO()
    tifffile.imwrite(buf, stacked.numpy().astype(np.float32))
    writers.write_atomic(out, buf.getvalue())
    writers.write_atomic(_report_path(out), writers.to_json(report).encode())
    return report
