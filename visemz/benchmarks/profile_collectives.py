"""Where a compressed all_reduce's time goes on the host: cProfile of rank 0 (run under torchrun).

    torchrun --nproc-per-node 2 -m visemz.benchmarks.profile_collectives [--mb 1] [--eb 1e-4] [--reps 20]
    # Gloo, CPU tensors, NumPy codecs:
    torchrun --nproc-per-node 2 -m visemz.benchmarks.profile_collectives --device cpu
    # CUDA tensors over Gloo (one GPU will do):
    torchrun --nproc-per-node 2 -m visemz.benchmarks.profile_collectives --backend gloo

For each algorithm (ring, recursive doubling), through the functional API (``all_reduce``) and
through a persistent plan (``visemz.collectives.plan``): the median milliseconds per call over
--reps calls after a warm-up (torch.cuda.synchronize() around each on CUDA), then the same calls
under cProfile on rank 0: Python-level function calls per all_reduce, and the listings by own
and by cumulative time.  Small tensors show the fixed cost per call: with 1 MB the GPU work is
microseconds, so what remains is the host's.  ``--api`` picks functional, plan or both.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

import torch
import torch.distributed as dist

from visemz.collectives import ErrorBounded, all_reduce, plan
from visemz.collectives.cost import exchanges


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def callers(args, x: torch.Tensor, codec, alg: str) -> dict:
    """api name -> a function running one all_reduce on a fresh copy of x."""
    out = {}
    if args.api in ("functional", "both"):
        out["functional"] = lambda: all_reduce(x.clone(), codec=codec, algorithm=alg)
    if args.api in ("plan", "both"):
        p = plan(x, codec=codec, algorithm=alg)  # collective: every rank makes it
        out["plan"] = lambda: p(x.clone())
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1.0, help="tensor size in MiB (float32)")
    ap.add_argument("--eb", type=float, default=1e-4)
    ap.add_argument("--predictor", default="lorenzo", help="the error-bounded codec's predictor: none, lorenzo")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--lines", type=int, default=22, help="profile lines printed per ordering")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: Gloo with CPU tensors")
    ap.add_argument("--api", choices=("functional", "plan", "both"), default="both")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                    help="for --device cuda: gloo moves the payloads through the host, and ranks may share GPUs "
                         "(rank r on GPU r mod count), so the device engine's host work can be profiled on one GPU")
    args = ap.parse_args(argv)
    local = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        index = local % torch.cuda.device_count() if args.backend == "gloo" else local
        torch.cuda.set_device(index)
        dev = torch.device("cuda", index)
        dist.init_process_group(args.backend, **({"device_id": dev} if args.backend == "nccl" else {}))
        name = f"{torch.cuda.get_device_name()} ({args.backend})"
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        name = "CPU (Gloo)"
    x = torch.rand(int(args.mb * 2**20) // 4, device=dev)
    codec = ErrorBounded(args.eb, predictor=args.predictor)
    print(f"rank {dist.get_rank()}: {name}, world {dist.get_world_size()}", flush=True)
    for alg in ("ring", "recursive_doubling"):
        for api, call in callers(args, x, codec, alg).items():
            for _ in range(3):
                call()
            sync(dev)
            dist.barrier()
            times = []
            for _ in range(args.reps):
                sync(dev)
                t0 = time.perf_counter()
                call()
                sync(dev)
                times.append(time.perf_counter() - t0)
            profile = cProfile.Profile()
            dist.barrier()
            profile.enable()
            for _ in range(args.reps):
                call()
            sync(dev)
            profile.disable()
            if dist.get_rank() == 0:
                stats = pstats.Stats(profile)
                ms, ex = statistics.median(times) * 1e3, exchanges(alg, dist.get_world_size())
                per = f"; call time / its {ex} compressed exchanges: {ms / ex:.3f} ms" if ex else ""
                print(f"== {alg} ({api}): median {ms:.3f} ms per call{per}, "
                      f"{stats.total_calls / args.reps:.0f} Python-level calls per call "
                      f"({stats.prim_calls / args.reps:.0f} primitive)", flush=True)
                for key in ("tottime", "cumulative"):
                    text = io.StringIO()
                    pstats.Stats(profile, stream=text).sort_stats(key).print_stats(args.lines)
                    print(text.getvalue(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
