"""Benchmark the compressed collectives on GPUs against NCCL's own all_reduce, in the same run.

    # codec throughputs only (one GPU, no torchrun):
    python scripts/bench_collectives.py --data ../shared/data/eval/xray --label h100 --out codec.json --quick --codecs-only --codec-mb 64
    # all_reduce over NVLink, then over TCP sockets on loopback (a stand-in for an inter-node link):
    torchrun --nproc-per-node 2 scripts/bench_collectives.py --data ../shared/data/eval/xray --label nvlink --out nvlink.json --quick
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \\
      torchrun --nproc-per-node 2 scripts/bench_collectives.py --data ../shared/data/eval/xray --label socket --out socket.json --quick

algbw = S / t and busbw = algbw * 2 (W - 1) / W (nccl-tests' all_reduce formulas), S the
uncompressed size in bytes.  Times are medians after a warm-up, each run bracketed by
torch.cuda.synchronize().  PSNR compares the result with the exact (float64) sum, over the
exact sum's value range.  Data: "image" (frames from --data, each scaled to [0, 1] float32,
tiled to the size, each rank starting at a different frame) and "smooth" (a smooth field).
Rank 0 also measures the codecs alone on its GPU: error-bounded encode/decode, the fused
homomorphic add against decompress-add-compress, and lossless bf16 on N(0, 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from visemz.collectives import ErrorBounded, Lossless, all_reduce
from visemz.collectives import gpu as G
from visemz.collectives.codecs import FLOATS, LL_HEAD
from visemz.pipeline import files, loaders
from visemz.pipeline.writers import write_atomic

MB = 1 << 20
NCCL_VARS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE", "NCCL_ALGO")


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up: communicators, kernel compilation, allocator
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


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


def make_data(kind: str, n: int, rank: int, pool: torch.Tensor | None, dev) -> torch.Tensor:
    if kind == "smooth":
        t = torch.linspace(0, 40, n, device=dev, dtype=torch.float32)
        return torch.sin(t + rank) * torch.cos(0.37 * t) + 0.5
    start = (rank * pool.numel() // 7) % pool.numel()
    idx = (torch.arange(n, dtype=torch.int64) + start) % pool.numel()
    return pool[idx].to(dev)


def psnr(got: torch.Tensor, exact: torch.Tensor) -> float:
    rng = float(exact.max() - exact.min()) or 1.0
    mse = float(((got.double() - exact) ** 2).mean())
    return 10 * math.log10(rng**2 / mse) if mse else float("inf")


def bench_all_reduce(args, pool, dev) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for size in args.sizes:
        n = size // 4
        for kind in ("image", "smooth"):
            x = make_data(kind, n, rank, pool, dev)
            exact = x.double()
            dist.all_reduce(exact)
            work = torch.empty_like(x)
            t_nccl = median_seconds(lambda: dist.all_reduce(work.copy_(x)), args.reps)
            rows.append(row("nccl", kind, size, None, t_nccl, world, psnr(work, exact)))
            for eb in args.ebs:
                for algorithm in ("ring", "recursive_doubling", "auto"):
                    t = median_seconds(lambda: all_reduce(work.copy_(x), codec=ErrorBounded(eb), algorithm=algorithm), args.reps)
                    rows.append(row(algorithm, kind, size, eb, t, world, psnr(work, exact), t_nccl))
                    if rank == 0:
                        print(json.dumps(rows[-1]), flush=True)
            del x, exact, work
            torch.cuda.empty_cache()
    return rows


def row(algorithm, kind, size, eb, t, world, p, t_nccl=None) -> dict:
    algbw = size / t / 1e9
    r = {"algorithm": algorithm, "data": kind, "bytes": size, "eb": eb, "seconds": t, "algbw_GBps": algbw,
         "busbw_GBps": algbw * 2 * (world - 1) / world, "psnr_db": p}
    if t_nccl is not None:
        r["speedup_over_nccl"] = t_nccl / t
    return r


def bench_codecs(args, pool, dev) -> dict:
    """Codec throughputs on one GPU (GB/s of uncompressed float32 / bf16 bytes).

    Encode includes the stream-size read every collective makes (it also raises bad input);
    decode writes the tensor's dtype (float32), decode_float64 the exact reconstruction.
    decompress-add-compress is what a codec without homomorphism does, on the same fused
    kernels: decode both to float32, add, encode the sum (its bytes can differ from the exact
    homomorphic sum by float32 rounding; its work is the same)."""
    n = args.codec_mb * MB // 4
    out = {}
    for kind in ("image", "smooth"):
        a, b = make_data(kind, n, 0, pool, dev), make_data(kind, n, 1, pool, dev)
        for eb in args.ebs:
            codec = ErrorBounded(eb)
            sa, sb = codec.encode_device(a)[0], codec.encode_device(b)[0]
            ratio = a.nbytes / sa.nbytes()
            t_enc = median_seconds(lambda: codec.encode_device(a)[0].nbytes(), args.reps)
            t_dec = median_seconds(lambda: codec.decode_device(sa, "float32"), args.reps)
            t_dec64 = median_seconds(lambda: codec.decode_device(sa), args.reps)
            t_add = median_seconds(lambda: G.add(sa, sb), args.reps)

            def doc():
                v = codec.decode_device(sa, "float32") + codec.decode_device(sb, "float32")
                codec.encode_device(v)[0].nbytes()

            t_doc = median_seconds(doc, args.reps)
            out[f"{kind}/eb={eb:g}"] = {
                "ratio": ratio, "encode_GBps": a.nbytes / t_enc / 1e9, "decode_GBps": a.nbytes / t_dec / 1e9,
                "decode_float64_GBps": a.nbytes / t_dec64 / 1e9,
                "homomorphic_add_GBps": a.nbytes / t_add / 1e9, "decompress_add_compress_GBps": a.nbytes / t_doc / 1e9,
                "homomorphic_speedup": t_doc / t_add}
            print(kind, f"eb={eb:g}", json.dumps(out[f"{kind}/eb={eb:g}"]), flush=True)
    x = torch.randn(n * 2, device=dev, generator=torch.Generator(dev).manual_seed(0)).to(torch.bfloat16)
    buf, _ = Lossless().encode_device(x)
    t_enc = median_seconds(lambda: Lossless().encode_device(x), args.reps)
    t_dec = median_seconds(lambda: G.ll_decode_wire(buf, x.numel(), "bfloat16", FLOATS, LL_HEAD), args.reps)
    out["lossless_bf16_normal"] = {"ratio": x.nbytes / buf.size, "encode_GBps": x.nbytes / t_enc / 1e9,
                                   "decode_GBps": x.nbytes / t_dec / 1e9}
    print("lossless bf16 N(0,1)", json.dumps(out["lossless_bf16_normal"]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="folder of image frames (e.g. ../shared/data/eval/xray)")
    ap.add_argument("--label", required=True, help="name of this run (e.g. nvlink, socket)")
    ap.add_argument("--out", type=Path, required=True, help="JSON report (written by rank 0)")
    ap.add_argument("--quick", action="store_true", help="1, 16 and 256 MB; eb 1e-2 and 1e-4; 3 repetitions")
    ap.add_argument("--codec-mb", type=int, default=256, help="tensor size for the codec throughputs")
    ap.add_argument("--codecs-only", action="store_true", help="measure the codecs on one GPU and stop")
    args = ap.parse_args()
    args.sizes = [MB, 16 * MB, 256 * MB] if args.quick else [MB << k for k in range(0, 11, 2)]  # 1 MB .. 1 GB
    args.ebs = [1e-2, 1e-4] if args.quick else [1e-2, 1e-3, 1e-4, 1e-5]
    args.reps = 3 if args.quick else 5

    distributed = "WORLD_SIZE" in os.environ
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    if distributed:
        dist.init_process_group("nccl", device_id=dev)
    rank = dist.get_rank() if distributed else 0
    pool = image_pool(args.data, (args.codec_mb * MB if args.codecs_only else max(args.sizes)) // 4)
    report = {"label": args.label, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
              "world": dist.get_world_size() if distributed else 1,
              "nccl_env": {k: os.environ[k] for k in NCCL_VARS if k in os.environ}}
    if rank == 0:
        print(f"[{args.label}] {report['device']} x{report['world']} {report['nccl_env']}", flush=True)
        report["codecs"] = bench_codecs(args, pool, dev)
    if distributed and not args.codecs_only:
        dist.barrier()
        report["all_reduce"] = bench_all_reduce(args, pool, dev)
        dist.destroy_process_group()
    if rank == 0:
        write_atomic(args.out, json.dumps(report, indent=1).encode())
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
