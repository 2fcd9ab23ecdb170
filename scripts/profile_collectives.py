"""Where a compressed all_reduce's time goes on the host: cProfile of rank 0 (run under torchrun).

    torchrun --nproc-per-node 2 scripts/profile_collectives.py [--mb 1] [--eb 1e-4] [--reps 20]

For each algorithm (ring, recursive doubling): the median milliseconds per call over --reps
calls after a warm-up (torch.cuda.synchronize() around each), then the same calls under
cProfile on rank 0, printed by own time and by cumulative time.  Small tensors show the fixed
cost per call: with 1 MB the GPU work is microseconds, so what remains is the host's.
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

from visemz.collectives import ErrorBounded, all_reduce


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1.0, help="tensor size in MiB (float32)")
    ap.add_argument("--eb", type=float, default=1e-4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--lines", type=int, default=22, help="profile lines printed per ordering")
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    x = torch.rand(int(args.mb * 2**20) // 4, device="cuda")
    codec = ErrorBounded(args.eb)
    print(f"rank {dist.get_rank()}: {torch.cuda.get_device_name()}, world {dist.get_world_size()}", flush=True)
    for alg in ("ring", "recursive_doubling"):
        for _ in range(3):
            all_reduce(x.clone(), codec=codec, algorithm=alg)
        torch.cuda.synchronize()
        dist.barrier()
        times = []
        for _ in range(args.reps):
            y = x.clone()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            all_reduce(y, codec=codec, algorithm=alg)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        profile = cProfile.Profile()
        dist.barrier()
        profile.enable()
        for _ in range(args.reps):
            all_reduce(x.clone(), codec=codec, algorithm=alg)
        torch.cuda.synchronize()
        profile.disable()
        if dist.get_rank() == 0:
            print(f"== {alg}: median {statistics.median(times) * 1e3:.3f} ms per call", flush=True)
            for key in ("tottime", "cumulative"):
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats(key).print_stats(args.lines)
                print(text.getvalue(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
