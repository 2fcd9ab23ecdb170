"""The learned transforms' speed and accuracy under each GPU math setting, against exact float32.

    python -m visemz.benchmarks.network --images DATA/eval/kodak/kodim01.png DATA/eval/xray/xray_15.png \
        --quality 4 --repeat 20 --out bench_network.json

For each image (an RGB image runs the shipped rgb model, a grayscale one the gray model) and each
setting: exact float32 (no TF32, NCHW: what the codec once ran), TF32 convolutions,
and either with channels-last tensors, plus bfloat16 autocast for comparison.  Per setting:

- analysis (g_a, h_a, the symbols) and synthesis (g_s on the decoded latent) in milliseconds, the
  median of --repeat runs after warm-up, the device synchronised around each; their ratio to exact
  float32 measured in the same run;
- analysis: the fraction of latent symbols y that differ from those of a float64 analysis (they only
  change the file's bits: any symbols decode anywhere);
- synthesis: the largest difference of the reconstruction from a float64 synthesis of the same
  latent, in [0, 1] units and in the image's integer levels after rounding (what a GPU decode may
  differ from a CPU decode by; the codec documents 1 level of uint8 and 1e-3 of a uint16 image's range).

A last row per hyperprior image times the float64 hyper-synthesis that gives the scales, through cuDNN
(``model.h_s``) and through ATen's im2col + GEMM convolutions (``architectures.hyper_synthesis``, what the
codec runs on a GPU), with their largest difference.

The device name is printed and stored.  Nothing is timed on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

from visemz import measure
from visemz.image import pixels
from visemz.io import loaders
from visemz.io.writers import write_atomic
from visemz.models import architectures, registry
from visemz.models import weights as W

SETTINGS = {  # name: (TF32 convolutions, channels-last, autocast dtype)
    "fp32": (False, False, None),
    "fp32-nhwc": (False, True, None),
    "tf32": (True, False, None),
    "tf32-nhwc": (True, True, None),
    "bf16-nhwc": (False, True, torch.bfloat16),
}


@contextlib.contextmanager
def math_setting(tf32: bool, dtype):
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        with torch.inference_mode(), torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def layout(t: torch.Tensor, nhwc: bool) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if nhwc else t.contiguous()


def run_image(path: Path, quality: float, repeat: int) -> list[dict]:
    img = loaders.load_image(path)
    t = pixels.as_tensor(img, "cuda")
    meta = pixels.describe(t)
    spec = registry.spec(registry.DEFAULT_MODEL, meta.variant)
    net, _ = W.load(spec, "cuda")
    x = pixels.to_batch(t, meta)
    with torch.inference_mode(False):
        net64 = architectures.build(spec).to("cuda").double().eval()
        net64.load_state_dict(net.state_dict())
    with torch.inference_mode():
        sym64 = architectures.analyse(net64, x.double(), quality)
        latent = architectures.dequantise(net, sym64, quality, torch.float32)
        ref = net64.g_s(latent.double()).clamp(0, 1)
    levels = 255.0 if meta.dtype == "uint8" else (65535.0 if meta.dtype == "uint16" else 1.0)
    rows = []
    for name, (tf32, nhwc, dtype) in SETTINGS.items():
        model = net.to(memory_format=torch.channels_last if nhwc else torch.contiguous_format)
        xi, yi = layout(x, nhwc), layout(latent, nhwc)
        with math_setting(tf32, dtype):
            t_an, sym = measure.median_seconds(lambda: architectures.analyse(model, xi, quality), repeat, warmup=3,
                                               sync=torch.cuda.synchronize)
            t_sy, rec = measure.median_seconds(lambda: model.g_s(yi), repeat, warmup=3, sync=torch.cuda.synchronize)
        rec = rec.float().clamp(0, 1)
        err = (rec.double() - ref).abs()
        lvl = (torch.round(rec.double() * levels) - torch.round(ref * levels)).abs()
        rows.append({
            "image": path.name, "shape": list(img.shape), "model": spec.name, "quality": quality, "setting": name,
            "analysis_ms": 1e3 * t_an, "synthesis_ms": 1e3 * t_sy,
            "y_symbols_differing": float((sym["y"] != sym64["y"]).float().mean()),
            "synthesis_max_error": float(err.max()), "synthesis_max_levels": float(lvl.max()),
            "synthesis_levels_over_1": float((lvl > 1).float().mean()),
        })
    net.to(memory_format=torch.contiguous_format)
    if architectures.has_hyperprior(net):
        rows.append(hyper_row(path.name, spec.name, net64, sym64["z"], quality, repeat))
    base = rows[0]
    for r in rows:
        if "analysis_ms" in r:
            r["analysis_speedup"] = base["analysis_ms"] / r["analysis_ms"]
            r["synthesis_speedup"] = base["synthesis_ms"] / r["synthesis_ms"]
    return rows


def hyper_row(image: str, model: str, net64, z_sym: torch.Tensor, quality: float, repeat: int) -> dict:
    """The float64 hyper-synthesis of one image's z: cuDNN's convolutions against ATen's GEMM ones."""
    _, inv = net64.hyper_gain.at(quality, torch.float64, z_sym.device)
    z_hat = (z_sym.double() + architectures.medians(net64.entropy_bottleneck).double()) * inv
    with torch.inference_mode():
        t_cudnn, ref = measure.median_seconds(lambda: net64.h_s(z_hat), repeat, warmup=3, sync=torch.cuda.synchronize)
        t_gemm, got = measure.median_seconds(lambda: architectures.hyper_synthesis(net64, z_hat), repeat, warmup=3,
                                             sync=torch.cuda.synchronize)
    return {"image": image, "model": model, "quality": quality, "setting": "hyper-synthesis float64",
            "cudnn_ms": 1e3 * t_cudnn, "gemm_ms": 1e3 * t_gemm, "gemm_speedup": t_cudnn / t_gemm,
            "max_relative_difference": float(((got - ref).abs() / ref.abs().clamp_min(1e-300)).max())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, nargs="+", required=True)
    ap.add_argument("--quality", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("bench_network.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark measures GPU math settings: no CUDA device")
    device = torch.cuda.get_device_name()
    print(f"device: {device}")
    rows = []
    for path in args.images:
        for r in run_image(path, args.quality, args.repeat):
            rows.append(r)
            print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    write_atomic(args.out, json.dumps({"device": device, "rows": rows}, indent=1).encode())


if __name__ == "__main__":
    main()
