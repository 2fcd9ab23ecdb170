"""Benchmark the compressed collectives on GPUs against NCCL's own, in the same run.

    # codec throughputs only (one GPU, no torchrun):
    python -m visemz.benchmarks.collectives --data DATA/eval/xray --label h100 --out codec.json --quick \\
        --codecs-only --codec-mb 64
    # all_reduce, all_to_all and scatter over NVLink on N GPUs, then over TCP sockets on loopback
    # (a stand-in for an inter-node link):
    torchrun --nproc-per-node N -m visemz.benchmarks.collectives --data DATA/eval/xray --label nvlink \\
      --out nvlink.json --ops all_reduce,all_to_all,scatter --sizes-mb 1,16,256 --ebs 1e-2,1e-4
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \\
      torchrun --nproc-per-node N -m visemz.benchmarks.collectives ... --label socket --out socket.json

Rows, per op, size, data and error bound: ``nccl`` (torch.distributed's own: dist.all_reduce,
dist.all_to_all, dist.scatter), ``plain`` (visemz with codec=None: NCCL plus the settings
agreement, i.e. visemz's per-call overhead), the compressed forms (all_reduce: ``ring``,
``recursive_doubling`` and ``auto``, whose row records what it chose and the model's
estimates; all_to_all and scatter: ``compressed``).  Bandwidths follow nccl-tests' performance
notes, S the uncompressed size in bytes:

- all_reduce: S the tensor; algbw = S / t, busbw = algbw * 2 (W - 1) / W;
- all_to_all: S what each rank sends in all (W parts of S / W); busbw = algbw * (W - 1) / W;
- scatter: S what the root scatters in all (W parts of S / W, root 0); busbw = algbw * (W - 1) / W.

A time is the median of ``--reps`` runs after a warm-up, each run bracketed by
torch.cuda.synchronize(), and the slowest rank's median counts.  PSNR compares the result with
the exact one (all_reduce: the float64 sum; the others: the parts sent), over its value range;
for all_to_all and scatter it is the worst rank's.  Data: "image" (frames from --data, each
scaled to [0, 1] float32, tiled to the size, each rank and part starting at a different frame)
and "smooth" (a smooth field).  Rank 0 prints one JSON line per row as it goes (a killed run
still shows what it measured) and rewrites the report atomically after each row.  Rank 0 also
measures the codecs alone on its GPU (unless --skip-codecs): error-bounded encode/decode, the
fused homomorphic add against decompress-add-compress, and lossless bf16 on N(0, 1).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from visemz import measure
from visemz.collectives import (
    all_reduce,
    all_to_all,
    autotune,
    last_algorithm,
    plan,
    scatter,
)
from visemz.floats import ErrorBounded, Lossless
from visemz.floats import gpu as G
from visemz.floats.dtypes import FLOATS
from visemz.floats.lossless import LL_HEAD
from visemz.io import files, loaders
from visemz.io.writers import write_atomic

MB = 1 << 20
NCCL_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE", "NCCL_ALGO")
OPS = ("all_reduce", "all_to_all", "scatter")
BUS_FACTOR = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_to_all": lambda w: (w - 1) / w,
              "scatter": lambda w: (w - 1) / w}


DEVICE = torch.device("cuda")  # where the tensors live: main() sets this rank's GPU, or the CPU (--device cpu)


# ----------------------------------------------------------------- timing and data
def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, reps: int) -> float:
    """After a warm-up call (communicators, kernel compilation, allocator, auto's calibration)."""
    return measure.median_seconds(fn, reps, warmup=1, sync=sync)[0]


def slowest(value: float, op=dist.ReduceOp.MAX) -> float:
    """The value of the slowest (MAX) or worst (MIN, for PSNR) rank, known to every rank."""
    t = torch.tensor([value], dtype=torch.float64, device=DEVICE)
    dist.all_reduce(t, op=op)
    return float(t.item())


def image_pool(folder: Path, limit_values: int) -> torch.Tensor:
    """Frames from ``folder`` scaled to [0, 1] each, concatenated (float32, on the CPU)."""
    frames, total = [], 0
    for path in files.discover(folder, files.IMAGE_EXTENSIONS):
        img = loaders.load_image(path).astype(np.float64)
        lo, hi = img.min(), img.max()
        frames.append(torch.from_numpy(((img - lo) / ((hi - lo) or 1.0)).astype(np.float32).reshape(-1)))
        total += frames[-1].numel()
        if total >= limit_values:
            break
    if not frames:
        raise SystemExit(f"no image frames in {folder}")
    return torch.cat(frames)


def make_data(kind: str, n: int, seed: int, pool: torch.Tensor | None, dev) -> torch.Tensor:
    """``n`` float32 values; ``seed`` (a rank, or rank and part) picks where they start."""
    if kind == "smooth":
        t = torch.linspace(0, 40, n, device=dev, dtype=torch.float32)
        return torch.sin(t + seed) * torch.cos(0.37 * t) + 0.5
    start = (seed * pool.numel() // 7) % pool.numel()
    idx = (torch.arange(n, dtype=torch.int64) + start) % pool.numel()
    return pool[idx].to(dev)


def psnr(got: torch.Tensor, exact: torch.Tensor) -> float:
    """Against the exact result's value range (``visemz.measure``'s peak of float data)."""
    return measure.psnr(exact.double().cpu().numpy(), got.double().cpu().numpy())


class Report:
    """Rows as they come: rank 0 prints each as a JSON line and rewrites the report atomically."""

    def __init__(self, path: Path, head: dict, rank: int):
        self.path, self.data, self.rank = path, dict(head), rank

    def add(self, section: str, row: dict) -> None:
        if self.rank != 0:
            return
        self.data.setdefault(section, []).append(row)
        print(json.dumps(row), flush=True)
        self.save()

    def save(self) -> None:
        if self.rank == 0:
            write_atomic(self.path, json.dumps(self.data, indent=1).encode())


def row(op: str, algorithm: str, kind: str, size: int, eb, t: float, world: int, p: float, t_nccl=None,
        **extra) -> dict:
    algbw = size / t / 1e9
    r = {"op": op, "algorithm": algorithm, "data": kind, "bytes": size, "eb": eb, "world": world, "seconds": t,
         "algbw_GBps": algbw, "busbw_GBps": algbw * BUS_FACTOR[op](world), "psnr_db": p}
    if t_nccl is not None:
        r["speedup_over_nccl"] = t_nccl / t
    r.update(extra)
    return r


# ------------------------------------------------------------------------ the ops
def bench_all_reduce(args, pool, dev, report: Report, kind: str, size: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    x = make_data(kind, size // 4, rank, pool, dev)
    exact = x.double()
    dist.all_reduce(exact)
    work = torch.empty_like(x)
    t_nccl = slowest(median_seconds(lambda: dist.all_reduce(work.copy_(x)), args.reps))
    report.add("rows", row("all_reduce", "nccl", kind, size, None, t_nccl, world, psnr(work, exact)))
    for api in args.api:  # ours, uncompressed: through a plan (agreed once) or the functional API (agreed per call)
        run = plan(work, codec=None) if api == "plan" else None

        def plain(run=run):
            return all_reduce(work.copy_(x), codec=None) if run is None else run(work.copy_(x))

        t = slowest(median_seconds(plain, args.reps))
        report.add("rows", row("all_reduce", "plain", kind, size, None, t, world, psnr(work, exact), t_nccl, api=api))
    for eb in args.ebs:
        for predictor in args.predictors:
            codec = ErrorBounded(eb, predictor)
            for algorithm in ("ring", "recursive_doubling", "auto"):
                for api in args.api:
                    chosen = []
                    # made once, collectively
                    run = plan(work, codec=codec, algorithm=algorithm) if api == "plan" else None

                    def call(algorithm=algorithm, codec=codec, chosen=chosen, run=run):
                        if run is None:
                            all_reduce(work.copy_(x), codec=codec, algorithm=algorithm)
                        else:
                            run(work.copy_(x))
                        chosen.append(last_algorithm())

                    t = slowest(median_seconds(call, args.reps))
                    extra = _auto_view(codec, size, chosen) if algorithm == "auto" else {}
                    report.add("rows", row("all_reduce", algorithm, kind, size, eb, t, world, psnr(work, exact), t_nccl,
                                           predictor=predictor, api=api, **extra))


def _auto_view(codec, size: int, chosen: list[str]) -> dict:
    """What auto chose (last run; every run's choice) and what its model expected, in ms."""
    out = {"auto_choice": chosen[-1], "auto_choices": sorted(set(chosen))}
    held = autotune.model(None, codec, "float32")
    if held is not None:
        m, ratio = held
        out["auto_ratio"] = ratio
        out["auto_calibration_s"] = autotune.calibration_seconds(None, codec, "float32")
        out["auto_estimates_ms"] = {a: s * 1e3 for a, s in m.estimates(size, ratio).items()}
    return out


def bench_all_to_all(args, pool, dev, report: Report, kind: str, size: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    n = size // 4 // world
    ins = [make_data(kind, n, rank * world + j, pool, dev) for j in range(world)]
    want = torch.cat([make_data(kind, n, j * world + rank, pool, dev) for j in range(world)])  # what rank j sends me
    outs = [torch.empty(n, device=dev) for _ in range(world)]

    def got():
        return torch.cat(outs)

    t_nccl = slowest(median_seconds(lambda: dist.all_to_all(outs, ins), args.reps))
    report.add("rows", row("all_to_all", "nccl", kind, size, None, t_nccl, world,
                           slowest(psnr(got(), want), dist.ReduceOp.MIN)))
    t = slowest(median_seconds(lambda: all_to_all(outs, ins, codec=None), args.reps))
    report.add("rows", row("all_to_all", "plain", kind, size, None, t, world,
                           slowest(psnr(got(), want), dist.ReduceOp.MIN), t_nccl))
    for eb in args.ebs:
        for predictor in args.predictors:
            codec = ErrorBounded(eb, predictor)
            t = slowest(median_seconds(lambda codec=codec: all_to_all(outs, ins, codec=codec), args.reps))
            p = slowest(psnr(got(), want), dist.ReduceOp.MIN)
            report.add("rows", row("all_to_all", "compressed", kind, size, eb, t, world, p, t_nccl,
                                   predictor=predictor))


def bench_scatter(args, pool, dev, report: Report, kind: str, size: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    n = size // 4 // world
    parts = [make_data(kind, n, j, pool, dev) for j in range(world)] if rank == 0 else None
    want = make_data(kind, n, rank, pool, dev)
    out = torch.empty(n, device=dev)
    t_nccl = slowest(median_seconds(lambda: dist.scatter(out, parts, src=0), args.reps))
    report.add("rows", row("scatter", "nccl", kind, size, None, t_nccl, world,
                           slowest(psnr(out, want), dist.ReduceOp.MIN)))
    t = slowest(median_seconds(lambda: scatter(out, parts, 0, codec=None), args.reps))
    report.add("rows", row("scatter", "plain", kind, size, None, t, world, slowest(psnr(out, want), dist.ReduceOp.MIN),
                           t_nccl))
    for eb in args.ebs:
        for predictor in args.predictors:
            codec = ErrorBounded(eb, predictor)
            t = slowest(median_seconds(lambda codec=codec: scatter(out, parts, 0, codec=codec), args.reps))
            report.add("rows", row("scatter", "compressed", kind, size, eb, t, world,
                                   slowest(psnr(out, want), dist.ReduceOp.MIN), t_nccl, predictor=predictor))


BENCHES = {"all_reduce": bench_all_reduce, "all_to_all": bench_all_to_all, "scatter": bench_scatter}


def bench_collectives(args, pool, dev, report: Report) -> None:
    for op in args.ops:
        for size in args.sizes:
            for kind in args.kinds:
                BENCHES[op](args, pool, dev, report, kind, size)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()


# ---------------------------------------------------------------------- codecs
def bench_codecs(args, pool, dev) -> dict:
    """Codec throughputs on one GPU (GB/s of uncompressed float32 / bf16 bytes).

    Encode includes the stream-size read every collective makes (it also raises bad input);
    decode writes the tensor's dtype (float32), decode_float64 the exact reconstruction.
    decompress-add-compress is what a codec without homomorphism does, on the same fused
    kernels: decode both to float32, add, encode the sum (its bytes can differ from the exact
    homomorphic sum by float32 rounding; its work is the same)."""
    n = args.codec_mb * MB // 4
    out = {}
    for kind in args.kinds:
        a, b = make_data(kind, n, 0, pool, dev), make_data(kind, n, 1, pool, dev)
        copy_to = torch.empty_like(a)
        t_copy = median_seconds(lambda a=a, copy_to=copy_to: copy_to.copy_(a), args.reps)  # the roofline: read + write
        out[f"{kind}/copy"] = {"copy_GBps": a.nbytes / t_copy / 1e9}
        for eb in args.ebs:
            for predictor in args.predictors:
                codec = ErrorBounded(eb, predictor)
                sa, sb = codec.encode_device(a)[0], codec.encode_device(b)[0]
                ratio = a.nbytes / sa.nbytes()
                t_enc = median_seconds(lambda codec=codec, a=a: codec.encode_device(a)[0].nbytes(), args.reps)
                t_dec = median_seconds(lambda codec=codec, sa=sa: codec.decode_device(sa, "float32"), args.reps)
                t_dec64 = median_seconds(lambda codec=codec, sa=sa: codec.decode_device(sa), args.reps)
                t_add = median_seconds(lambda sa=sa, sb=sb: G.add(sa, sb), args.reps)

                def doc(codec=codec, sa=sa, sb=sb):
                    v = codec.decode_device(sa, "float32") + codec.decode_device(sb, "float32")
                    codec.encode_device(v)[0].nbytes()

                t_doc = median_seconds(doc, args.reps)
                key = f"{kind}/eb={eb:g}/{predictor}"
                out[key] = {
                    "ratio": ratio, "encode_GBps": a.nbytes / t_enc / 1e9, "decode_GBps": a.nbytes / t_dec / 1e9,
                    "decode_float64_GBps": a.nbytes / t_dec64 / 1e9, "copy_GBps": a.nbytes / t_copy / 1e9,
                    "homomorphic_add_GBps": a.nbytes / t_add / 1e9,
                    "decompress_add_compress_GBps": a.nbytes / t_doc / 1e9, "homomorphic_speedup": t_doc / t_add}
                print(kind, key, json.dumps(out[key]), flush=True)
    x = torch.randn(n * 2, device=dev, generator=torch.Generator(dev).manual_seed(0)).to(torch.bfloat16)
    buf, _ = Lossless().encode_device(x)
    t_enc = median_seconds(lambda: Lossless().encode_device(x), args.reps)
    t_dec = median_seconds(lambda: G.ll_decode_wire(buf, x.numel(), "bfloat16", FLOATS, LL_HEAD), args.reps)
    out["lossless_bf16_normal"] = {"ratio": x.nbytes / buf.size, "encode_GBps": x.nbytes / t_enc / 1e9,
                                   "decode_GBps": x.nbytes / t_dec / 1e9}
    print("lossless bf16 N(0,1)", json.dumps(out["lossless_bf16_normal"]), flush=True)
    return out


# ------------------------------------------------------------------------- main
def _numbers(text: str, kind=float) -> list:
    return [kind(v) for v in text.split(",") if v.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="folder of image frames (e.g. DATA/eval/xray); needed for 'image' data")
    ap.add_argument("--label", required=True, help="name of this run (e.g. nvlink, socket)")
    ap.add_argument("--out", type=Path, required=True, help="JSON report (written by rank 0)")
    ap.add_argument("--quick", action="store_true", help="1, 16 and 256 MB; eb 1e-2 and 1e-4; 3 repetitions")
    ap.add_argument("--ops", default="all_reduce", help=f"comma-separated, of {','.join(OPS)}")
    ap.add_argument("--sizes-mb",
                    help="comma-separated sizes in MiB (overrides --quick's and the full default 1..1024)")
    ap.add_argument("--ebs", help="comma-separated error bounds (overrides the defaults)")
    ap.add_argument("--kinds", default="image,smooth", help="data kinds: image (needs --data), smooth")
    ap.add_argument("--reps", type=int, help="timed repetitions per row (default 3 with --quick, else 5)")
    ap.add_argument("--codec-mb", type=int, default=256, help="tensor size for the codec throughputs")
    ap.add_argument("--codecs-only", action="store_true", help="measure the codecs on one GPU and stop")
    ap.add_argument("--skip-codecs", action="store_true", help="measure the collectives only")
    ap.add_argument("--predictors", default="none,lorenzo",
                    help="error-bounded predictors, comma-separated: none,lorenzo")
    ap.add_argument("--api", default="functional,plan",
                    help="all_reduce through the functional API (agrees per call) and/or a persistent plan")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: Gloo and CPU tensors, codecs skipped (a smoke test, not a measurement)")
    args = ap.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.predictors = [p for p in args.predictors.split(",") if p]
    args.api = [a for a in args.api.split(",") if a]
    if set(args.predictors) - {"none", "lorenzo"} or set(args.api) - {"functional", "plan"} or \
            not args.predictors or not args.api:
        ap.error("--predictors takes none,lorenzo (flat tensors: no rows for lorenzo2d); --api takes functional,plan")
    if set(args.ops) - set(OPS) or set(args.kinds) - {"image", "smooth"} or not args.ops or not args.kinds:
        ap.error(f"--ops takes {','.join(OPS)}; --kinds takes image,smooth")
    if "image" in args.kinds and args.data is None:
        ap.error("image data needs --data FOLDER (or --kinds smooth)")
    default_sizes = [1, 16, 256] if args.quick else [1 << k for k in range(0, 11, 2)]  # 1 MB .. 1 GB
    args.sizes = [int(s * MB) for s in (_numbers(args.sizes_mb) if args.sizes_mb else default_sizes)]
    args.ebs = _numbers(args.ebs) if args.ebs else ([1e-2, 1e-4] if args.quick else [1e-2, 1e-3, 1e-4, 1e-5])
    args.reps = args.reps or (3 if args.quick else 5)
    return args


def main(argv=None) -> None:
    global DEVICE
    args = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        dev = DEVICE = torch.device("cuda", local)
    else:
        dev = DEVICE = torch.device("cpu")
        args.skip_codecs = True
    if distributed:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                **({"device_id": dev} if dev.type == "cuda" else {}))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if any(s % (4 * world) for s in args.sizes):
        raise SystemExit(f"sizes must split into {world} parts of float32 values: {args.sizes}")
    needed = args.codec_mb * MB if args.codecs_only else max(args.sizes)
    pool = image_pool(args.data, needed // 4) if "image" in args.kinds else None
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    report = Report(args.out, {"label": args.label, "device": name, "torch": torch.__version__,
                               "world": world, "ops": args.ops, "reps": args.reps,
                               "nccl_env": {k: os.environ[k] for k in NCCL_VARS if k in os.environ}}, rank)
    if rank == 0:
        print(f"[{args.label}] {report.data['device']} x{world} {report.data['nccl_env']}", flush=True)
        if not args.skip_codecs:
            report.data["codecs"] = bench_codecs(args, pool, dev)
            report.save()
    if distributed and not args.codecs_only:
        dist.barrier()
        bench_collectives(args, pool, dev, report)
        dist.destroy_process_group()
    report.save()
    if rank == 0:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
