"""Export trained checkpoints as the shipped int8 weights, each with a model card.

    python scripts/export_weights.py --ckpt runs/r1 --data ../shared/data --out visemz/models/weights

The card records the training (data, steps, lambda, seconds on which GPU) and bpp/PSNR/MS-SSIM
measured by compressing the evaluation images with the exported weights through visemz
itself (real file sizes), on the device given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

import evalkit
from visemz.models import architectures, parse
from visemz.models import weights as W


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", type=Path, default=Path("visemz/models/weights"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--limit", type=int, default=None, help="evaluate on the first N images of each set")
    ap.add_argument("--gpu-name", default=None, help="GPU the checkpoints were trained on (for the card)")
    args = ap.parse_args()

    state = json.loads((args.ckpt / "state.json").read_text())
    gpu = args.gpu_name or (torch.cuda.get_device_name() if torch.cuda.is_available() else "unknown")
    os.environ["VISEMZ_WEIGHTS_DIR"] = str(args.out)
    import visemz

    codec = visemz.ImageCodec(args.device)
    for group in sorted(args.ckpt.glob("*.safetensors")):
        tensors = load_file(str(group))
        for name in sorted({k.split("/", 1)[0] for k in tensors}):
            spec = parse(name)
            model = architectures.build(spec)
            model.load_state_dict({k.split("/", 1)[1]: v.float() for k, v in tensors.items() if k.startswith(name + "/")})
            if not all(torch.isfinite(v).all() for v in model.state_dict().values()):
                raise SystemExit(f"{name}: checkpoint holds non-finite values; not exported")
            card = {
                "arch": spec.arch, "variant": spec.variant, "quality": spec.quality, "lambda": spec.lam,
                "compressai_quality": spec.compressai_quality, "N": spec.N, "M": spec.M,
                "data": f"../shared/data/train/{spec.variant} (random 256x256 crops, flips)",
                "steps": state["steps"][name], "batch": 16, "checkpoint_note": state.get("note", ""),
                "train_seconds_all_models": round(state["train_seconds"], 1),
                "trained_on": gpu, "storage": "int8 convolution kernels (per-channel float32 scale), float32 otherwise",
                "exported": datetime.date.today().isoformat(),
            }
            W.save(model, spec, args.out / f"{name}.safetensors", card)
            W.load.cache_clear()
            card["eval"] = evaluate(codec, spec, args.data, args.limit)
            card["eval_device"] = torch.cuda.get_device_name() if codec.device == "cuda" else "cpu"
            W.save(model, spec, args.out / f"{name}.safetensors", card)
            print(name, json.dumps(card["eval"]))


def evaluate(codec, spec, data: Path, limit) -> dict:
    import visemz

    results = {}
    for set_name, images in evalkit.eval_sets(data, spec.variant, limit).items():
        rows = []
        for _, img in images:
            buf = codec.compress(img, model=spec.arch, quality=spec.quality)
            rec = visemz.decompress(buf, device="cpu") if codec.device == "cpu" else codec.decompress(buf)
            rows.append((evalkit.bpp(len(buf), img), evalkit.psnr(img, rec), evalkit.ms_ssim(img, rec)))
        results[set_name] = {"images": len(rows), "bpp": round(evalkit.mean(r[0] for r in rows), 4),
                             "psnr": round(evalkit.mean(r[1] for r in rows), 3),
                             "ms_ssim": round(evalkit.mean(r[2] for r in rows), 5)}
    return results


if __name__ == "__main__":
    main()
