"""The coding networks' float64 convolution layers on a GPU: ATen's im2col + GEMM against conv64's implicit GEMM.

    python -m visemz.benchmarks.float64_layers --out bench_float64_layers.json [--configs 128,16,64,4,2,1 ...]
        [--layouts first last]

One layer at a time, at the sizes a 2048 x 2048 image gives them (seeded random weights and inputs, float64):
the residual prior's 3 x 3 convolutions at half resolution, g_s's transposed convolutions of 128 and of one
output, g_s's IGDN layers after its two largest, and a hyper-synthesis convolution (h_s runs on ATen: this row
says why).  Per layer: ATen's time (``architectures.native_forward``, what runs with ``implicit_gemm`` off) and
conv64's under each tile configuration (BLOCK_M, BLOCK_K, BLOCK_N_MAX, warps, stages, then optionally: split,
48 outputs as 32 + 16 or not; specialize; BLOCK_K_WIDE; TILE_W and TILE_W_LAST, 0 or a program's tile width
over channels-first and channels-last tensors) and each of --layouts (the input's, which the output follows),
medians of --reps synchronised runs after one, with the speedup and the largest difference relative to the
output's largest value.  Prints the device.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from compressai.layers import GDN

from visemz import markdown, measure
from visemz.io.writers import write_atomic
from visemz.models import architectures, conv64

# name, layer, input shape, ReLU after it
LAYERS = (
    ("prior 3x3 conv 52->48, ReLU", lambda: torch.nn.Conv2d(52, 48, 3, padding=1), (1, 52, 1024, 1024), True),
    ("prior 3x3 conv 48->48, ReLU", lambda: torch.nn.Conv2d(48, 48, 3, padding=1), (1, 48, 1024, 1024), True),
    ("g_s 5x5/2 transposed 128->128", lambda: torch.nn.ConvTranspose2d(128, 128, 5, 2, 2, 1), (1, 128, 512, 512),
     False),
    ("g_s IGDN 128", lambda: _gdn(128), (1, 128, 1024, 1024), False),
    ("g_s IGDN 128", lambda: _gdn(128), (1, 128, 512, 512), False),
    ("g_s 5x5/2 transposed 128->1", lambda: torch.nn.ConvTranspose2d(128, 1, 5, 2, 2, 1), (1, 128, 1024, 1024), False),
    ("h_s 3x3 conv 192->288", lambda: torch.nn.Conv2d(192, 288, 3, padding=1), (1, 192, 128, 128), False),
)
KNOBS = ("BLOCK_M", "BLOCK_K", "BLOCK_N_MAX", "WARPS", "STAGES", "SPLIT_N", "SPECIALIZE", "BLOCK_K_WIDE",
         "TILE_W", "TILE_W_LAST")
LAYOUTS = {"first": torch.contiguous_format, "last": torch.channels_last}
DEFAULT_CONFIG = tuple(int(getattr(conv64, k)) for k in KNOBS)


def _gdn(channels: int) -> architectures.FrozenGDN:
    """g_s's IGDN with seeded parameters away from its initial identity (frozen once converted to float64)."""
    g = GDN(channels, inverse=True)
    with torch.no_grad():
        g.gamma.add_(0.05 * torch.rand(channels, channels))
    return g


def _kernel_of(layer):
    if isinstance(layer, torch.nn.Conv2d):
        return conv64.conv2d
    if isinstance(layer, torch.nn.ConvTranspose2d):
        return conv64.conv_transpose2d
    return lambda x, g, relu: conv64.gdn(x, g.gamma_eff, g.beta_eff, g.inverse)


def _configure(config) -> None:
    for knob, value in zip(KNOBS, (*config, *DEFAULT_CONFIG[len(config):])):
        setattr(conv64, knob, value)


def layer_rows(name: str, make, shape, relu: bool, configs, layouts, reps: int) -> list[dict]:
    torch.manual_seed(0)
    layer = make().double().cuda().requires_grad_(False)
    stack = torch.nn.Sequential(layer, torch.nn.ReLU()) if relu else torch.nn.Sequential(layer)
    architectures.freeze_gdn(stack)
    x = torch.randn(*shape, dtype=torch.float64, device="cuda")
    run = _kernel_of(layer)
    aten_s, want = measure.median_seconds(lambda: architectures.native_forward(stack, x), reps, warmup=1,
                                          sync=torch.cuda.synchronize)
    rows = [{"layer": name, "kernel": "aten", "ms": 1e3 * aten_s, "speedup": 1.0, "rel_diff": 0.0}]
    for config in configs:
        for layout in layouts:
            _configure(config)
            try:
                given = x.contiguous(memory_format=LAYOUTS[layout])
                s, got = measure.median_seconds(lambda: run(given, layer, relu), reps, warmup=1,
                                                sync=torch.cuda.synchronize)
            finally:
                _configure(DEFAULT_CONFIG)
            rows.append({"layer": name, "kernel": f"conv64 {','.join(map(str, config))} channels {layout}",
                         "ms": 1e3 * s, "speedup": aten_s / s,
                         "rel_diff": float((got - want).abs().max() / want.abs().max())})
    return rows


def main(argv=None) -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--configs", nargs="+", default=[",".join(map(str, DEFAULT_CONFIG))],
                   help=f"conv64 configurations, the values of {','.join(KNOBS)} (those left out: the defaults)")
    a.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=["first"],
                   help="the inputs' layouts, channels first or last (the outputs follow)")
    a.add_argument("--layers", type=int, default=len(LAYERS), help="the first N layers of the list only")
    a.add_argument("--scale", type=int, default=1, help="divide the inputs' height and width by this (quick runs)")
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--out", type=Path, required=True)
    args = a.parse_args(argv)
    if not torch.cuda.is_available() or not conv64.available():
        raise SystemExit("float64_layers needs a CUDA GPU and Triton")
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs]
    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}", flush=True)
    rows = []
    for name, make, shape, relu in LAYERS[:args.layers]:
        shape = (*shape[:2], shape[2] // args.scale, shape[3] // args.scale)
        rows += layer_rows(f"{name} @ {shape[2]}x{shape[3]}", make, shape, relu, configs, args.layouts, args.reps)
    print("\n".join(markdown.table(("layer", "kernel", "ms", "speedup", "rel. difference"), [
        (r["layer"], r["kernel"], f"{r['ms']:.2f}", f"{r['speedup']:.2f}x", f"{r['rel_diff']:.1e}") for r in rows])),
          flush=True)
    report = {"device": device, "host": platform.node(), "torch": torch.__version__, "reps": args.reps, "rows": rows}
    write_atomic(args.out, (json.dumps(report, indent=1) + "\n").encode())


if __name__ == "__main__":
    main()
