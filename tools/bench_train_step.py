"""Training step time per architecture on one GPU: what the choice of the context model weighs.

    python tools/bench_train_step.py [--batch 16] [--patch 256] [--steps 30] [--warmup 10] [--out step.json]

The median time of a whole training step (crops cut on the device, forward under bf16 autocast, the
loss, backward, gradient clipping, both Adams), in milliseconds, after --warmup steps, the device
synchronised around each step, for:

- ``mbt2018-mean`` N=128/M=192 (the shipped models' size) and N=192/M=320 (the zoo's size for its
  high qualities): visemz's mean-scale hyperprior with gain units, tools/train.py's step;
- ``minnen2020`` N=192/M=320, five slices: the channel-context model, tools/train.py's step;
- ``elic2022-chandelier`` N=192/M=320: CompressAI 1.2.8's ``Elic2022Chandelier`` (no gain units: one
  lambda; its own forward under the same autocast), eagerly, when it builds.

Each of visemz's models is timed eagerly and, on CUDA, as tools/train.py runs it: one CUDA graph per
step (``--no-graphs`` leaves that out).  Peak device memory per model is reported.  The crops come from
random images (the step's time does not depend on the pixels).  The device name is printed and stored;
``--tiny`` (N=16, M=40, slices of 8; a smoke test, e.g. on the CPU) measures nothing worth reporting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import train  # tools/train.py, beside this file: the training step itself
from visemz.io.writers import write_atomic
from visemz.models import registry

ELIC = "elic2022-chandelier"
MODELS = ("mbt2018-mean-128-192", "mbt2018-mean-192-320", "minnen2020", ELIC)
ELIC_LAMBDA = registry.COMPRESSAI_LAMBDAS[3]


def spec_of(name: str, tiny: bool) -> registry.ModelSpec:
    if name.startswith("mbt2018-mean"):
        n, m = (16, 40) if tiny else map(int, name.split("-")[2:])
        return registry.ModelSpec("mbt2018-mean", "rgb", n, m)
    if tiny:
        return registry.ModelSpec("minnen2020", "rgb", 16, 40, (8,) * 5)
    return registry.spec("minnen2020", "rgb")


def sampler_of(args, device) -> train.CropSampler:
    rng = np.random.default_rng(0)
    size = max(2 * args.patch, 64)
    images = [train.Image(train._to16(rng.integers(0, 256, (3, size, size), dtype=np.uint8)), "photo")
              for _ in range(4)]
    return train.CropSampler(images, train.draw_weights(images, None), args.patch, device)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, args, device) -> dict:
    """Median, 10th and 90th percentile ms of ``step()`` after warm-up, and the peak device memory."""
    for _ in range(args.warmup):
        step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(1e3 * (time.perf_counter() - t0))
    q = np.percentile(times, [10, 90])
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"median_ms": round(statistics.median(times), 3), "p10_ms": round(float(q[0]), 3),
            "p90_ms": round(float(q[1]), 3), "peak_gib": None if peak is None else round(peak, 2)}


def visemz_rows(name: str, args, device, sampler) -> list[dict]:
    spec = spec_of(name, args.tiny)
    rows = []
    for graphs in (False, True) if device.type == "cuda" and not args.no_graphs else (False,):
        torch.manual_seed(0)
        t = train.Trainer(f"{spec.arch}-rgb", sampler, args.batch, device, 1e-5, amp=not args.no_amp, spec=spec)
        if graphs:
            t.capture()
        row = time_steps(lambda: t.train_step(1.0), args, device)
        params = sum(p.numel() for p in t.model.parameters())
        rows.append({"model": name, "N": spec.N, "M": spec.M, "slices": list(spec.slices),
                     "params_m": round(params / 1e6, 2), "mode": "cuda graph" if graphs else "eager", **row})
        t = None  # free it now (not del: the lambda above names it)
    return rows


def elic_rows(args, device, sampler) -> list[dict]:
    try:
        from compressai.models import Elic2022Chandelier
    except ImportError as e:
        return [{"model": ELIC, "error": f"does not import: {e}"}]
    n, m, groups = (16, 40, [4, 4, 8, 8, 16]) if args.tiny else (192, 320, None)
    torch.manual_seed(0)
    net = Elic2022Chandelier(N=n, M=m, groups=groups).to(device).train()
    aux_names = {k for k, _ in net.named_parameters() if k.endswith("quantiles")}
    main = [p for k, p in net.named_parameters() if k not in aux_names]
    opt = torch.optim.Adam(main, lr=1e-5)
    aux_opt = torch.optim.Adam([p for k, p in net.named_parameters() if k in aux_names], lr=1e-3)
    x = torch.zeros(args.batch, 3, args.patch, args.patch, device=device)

    def step() -> None:
        sampler.sample_into(x)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.no_amp):
            out = net(x)
        bits = sum(torch.log(v.float()).sum() for v in out["likelihoods"].values()) / -np.log(2)
        bpp = bits / (x.shape[0] * x.shape[2] * x.shape[3])
        loss = ELIC_LAMBDA * 255**2 * torch.mean((out["x_hat"].float() - x) ** 2) + bpp
        aux = net.aux_loss()
        opt.zero_grad(set_to_none=True)
        aux_opt.zero_grad(set_to_none=True)
        (loss + aux).backward()
        torch.nn.utils.clip_grad_norm_(main, 1.0)
        opt.step()
        aux_opt.step()

    row = time_steps(step, args, device)
    return [{"model": ELIC, "N": n, "M": m, "slices": groups or [16, 16, 32, 64, m - 128],
             "params_m": round(sum(p.numel() for p in net.parameters()) / 1e6, 2), "mode": "eager", **row}]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--patch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per model and mode")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (cuDNN's autotuning, Adam's state)")
    ap.add_argument("--no-graphs", action="store_true", help="time visemz's models eagerly only")
    ap.add_argument("--tiny", action="store_true", help="N=16, M=40 models: a smoke test, not a measurement")
    ap.add_argument("--no-amp", action="store_true", help="float32 instead of bf16 autocast (CPUs run bf16 slowly)")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; batch {args.batch} of {args.patch}x{args.patch}, "
          f"{'float32' if args.no_amp else 'bf16 autocast'}, median of {args.steps} "
          f"steps after {args.warmup}", flush=True)
    sampler = sampler_of(args, device)
    rows = []
    for model in args.models:
        for row in elic_rows(args, device, sampler) if model == ELIC else visemz_rows(model, args, device, sampler):
            rows.append(row)
            print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result = {"device": name, "batch": args.batch, "patch": args.patch, "steps": args.steps, "warmup": args.warmup,
              "amp": not args.no_amp, "tiny": args.tiny, "rows": rows}
    if args.out:
        write_atomic(args.out, (json.dumps(result, indent=1) + "\n").encode())
    return result


if __name__ == "__main__":
    main()
