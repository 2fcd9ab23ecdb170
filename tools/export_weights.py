"""Export trained checkpoints as the shipped int8 weights with model cards, and measure the cards.

    python tools/export_weights.py --ckpt runs/r1 --out visemz/models/weights --qualities '' \
        [--storage-check 1,4,8 --device cpu --limit 4]          # weights and cards, int8 loss measured
    python tools/export_weights.py --out visemz/models/weights --data DATA --device cuda
                                                                # every card's eval, measured
    python tools/export_weights.py --out visemz/models/weights --add-tables
                                                                # (re)compute the entropy coding tables

With --ckpt, reads the compact checkpoints of tools/train.py (NAME.safetensors, step and
seconds in their metadata) and writes NAME.safetensors + NAME.json to --out.  A NAME@tag
checkpoint (an ablation) is exported only when named in --models, as NAME.safetensors in
--out (use a folder of its own).  The card records the training (data, steps, seconds, GPU,
note).  --storage-check measures what int8 storage costs against the checkpoint's float32
weights (PSNR dB and bpp ratio on the variant's main eval set at those qualities).
--qualities (default 1..8) then measures bpp/PSNR/MS-SSIM of every model in --out at each
quality by compressing the evaluation images through visemz itself (real file sizes) on
--device, and writes them into the cards.  --add-tables re-writes every weights file in --out
with its entropy coding tables computed afresh (W.save does this for new exports), keeping the
network tensors byte for byte (checked) and each card, whose model_id it updates; then stops.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from visemz import measure
from visemz.benchmarks.common import ms_ssim as ms_ssim_of
from visemz.evaluation.datasets import model_sets
from visemz.models import architectures, parse, training
from visemz.models import weights as W

# What a model saw, for its card: the folders tools/train.py reads (train3 as
# tools/prepare_training_data.py writes it; its manifest.json lists every image and what was kept out).
DATA = {"rgb": "train/rgb + train2/rgb + train3/rgb (ImageNet class samples and BSDS500 photos downscaled 0.75x, "
               "CBSD68 and near-duplicates of eval/ left out) (random 256x256 crops, flips)",
        "gray": "train/gray + train2/gray + train2/gray16 + train3/gray (COVID-CXNet chest X-rays, the evaluation "
                "X-rays' near-duplicates and source left out) + luminance of the RGB photos (random 256x256 crops, "
                "flips; drawn by group: xray 0.35, science 0.25, photo 0.40)"}


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k).float() for k in f.keys()}, dict(f.metadata() or {})


def build(name: str, spec, tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The float32 model of a checkpoint's tensors (read_checkpoint), in eval mode."""
    model = architectures.build(spec)
    model.load_state_dict(tensors)
    if not all(torch.isfinite(v).all() for v in model.state_dict().values()):
        raise SystemExit(f"{name}: checkpoint holds non-finite values; not used")
    return model.eval()


@contextlib.contextmanager
def float32_weights(model, spec):
    """Inside the block, visemz's codec runs ``model`` for ``spec`` with float32 kernels: its weights
    saved (with their tables) to a temporary VISEMZ_WEIGHTS_DIR, the loaded models' caches cleared
    on the way in and out."""
    saved = os.environ.get("VISEMZ_WEIGHTS_DIR")
    with tempfile.TemporaryDirectory() as folder:
        W.save(model, spec, Path(folder) / f"{spec.name}.safetensors", {"note": "float32 reference"}, storage="float32")
        os.environ["VISEMZ_WEIGHTS_DIR"] = folder
        W.load.cache_clear()
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("VISEMZ_WEIGHTS_DIR", None)
            else:
                os.environ["VISEMZ_WEIGHTS_DIR"] = saved
            W.load.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, default=None, help="checkpoints to export (default: only measure --out)")
    ap.add_argument("--data", type=Path, default=None,
                    help="the data folder (e.g. DATA: its eval/kodak and eval/xray), for --storage-check and "
                         "--qualities")
    ap.add_argument("--out", type=Path, default=Path("visemz/models/weights"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", nargs="*", default=None, help="checkpoint names to export (default: all but NAME@tag)")
    ap.add_argument("--qualities", default="1,2,3,4,5,6,7,8", help="qualities the cards' eval measures ('': none)")
    ap.add_argument("--storage-check", default="", help="qualities at which int8 is compared with float32")
    ap.add_argument("--limit", type=int, default=None, help="evaluate on the first N images of each set")
    ap.add_argument("--gpu-name", default=None, help="GPU the checkpoints were trained on (for the card)")
    ap.add_argument("--add-tables", action="store_true", help="only (re)compute the weights' entropy coding tables")
    args = ap.parse_args()
    if args.add_tables:
        for path in sorted(args.out.glob("*.safetensors")):
            add_tables(path)
        return
    if args.data is None and (args.storage_check or any(q for q in args.qualities.split(","))):
        ap.error("--data is required to measure the cards (--qualities, --storage-check; --qualities '': none)")

    os.environ["VISEMZ_WEIGHTS_DIR"] = str(args.out)
    import visemz

    codec = visemz.ImageCodec(args.device)
    if args.ckpt:
        checks = [float(q) for q in args.storage_check.split(",") if q]
        names = args.models or sorted(p.name[: -len(".safetensors")] for p in args.ckpt.glob("*.safetensors")
                                      if "@" not in p.name and not p.name.endswith(".full.safetensors"))
        for name in names:
            export(codec, name, args, checks)
    qualities = [float(q) for q in args.qualities.split(",") if q]
    if qualities:
        for card_path in sorted(args.out.glob("*.json")):
            measure_card(codec, card_path, args, qualities)


def export(codec, name: str, args, checks: list[float]) -> None:
    tensors, meta = read_checkpoint(args.ckpt / f"{name}.safetensors")
    trained = training.parse_name(name)  # NAME@tag: an ablation of NAME
    spec = trained.spec
    model = build(name, spec, tensors)
    card = {
        "arch": spec.arch, "variant": spec.variant, "N": spec.N, "M": spec.M,
        "variable_rate": "gain units (Cui et al. 2021), quality 1-8 on CompressAI's lambda ladder"
                         if trained.quality is None else f"no: trained at quality {trained.quality:g} only",
        "data": DATA[spec.variant], "steps": int(meta.get("step", 0)), "batch": 16,
        "checkpoint": name, "checkpoint_note": meta.get("note", ""),
        "train_seconds": float(meta.get("train_seconds", 0.0)), "trained_on": args.gpu_name or "unknown",
        "exported": datetime.date.today().isoformat(),
    }
    W.save(model, spec, args.out / f"{spec.name}.safetensors", card)
    W.load.cache_clear()
    if checks:
        int8 = evaluate(codec, spec, args.data, args.limit, checks, main_set(spec))
        card["int8_storage_loss"] = storage_loss(codec, model, spec, args, checks, int8)
        W.write_card(args.out / f"{spec.name}.safetensors", dict(card, storage="int8"), spec)
    print(name, json.dumps({k: card.get(k) for k in ("steps", "int8_storage_loss")}), flush=True)


def add_tables(path: Path) -> None:
    """W.add_tables on one weights file, checking that its network tensors did not change."""
    def network(p: Path) -> dict[str, bytes]:
        tensors, _ = W.read_tensors(p)
        return {k: v.numpy().tobytes() for k, v in tensors.items() if not k.startswith("tables/")}

    before = network(path)
    model_id = W.add_tables(parse(path.stem), path)
    if network(path) != before:
        raise SystemExit(f"{path.name}: network tensors changed while adding tables")
    print(f"{path.name}: tables added, network tensors unchanged, model_id {model_id}", flush=True)


def measure_card(codec, card_path: Path, args, qualities: list[float]) -> None:
    card = json.loads(card_path.read_text())
    spec = parse(card["model"])
    card["eval"] = evaluate(codec, spec, args.data, args.limit, qualities)
    card["eval_device"] = torch.cuda.get_device_name() if codec.device == "cuda" else "cpu"
    tmp = card_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(card, indent=1) + "\n")
    os.replace(tmp, card_path)
    print(card["model"], json.dumps(card["eval"]), flush=True)


def main_set(spec) -> str:
    return "kodak" if spec.variant == "rgb" else "xray"


def evaluate(codec, spec, data: Path, limit, qualities: list[float], only: str | None = None) -> dict:
    """{set: {quality: {images, bpp, psnr, ms_ssim}}} through visemz's own files (``only``: one set)."""
    results = {}
    for set_name, images in model_sets(data, spec.variant, limit).items():
        if only and set_name != only:
            continue
        per_q = {}
        for q in qualities:
            m = measure_at(codec, spec, images, q)
            per_q[f"{q:g}"] = {"images": m["images"], "bpp": round(m["bpp"], 4), "psnr": round(m["psnr"], 3),
                               "ms_ssim": round(m["ms_ssim"], 5)}
        results[set_name] = per_q
    return results


def measure_at(codec, spec, images: list[tuple[str, object]], q: float, ms_ssim: bool = True) -> dict:
    """{images, bpp, psnr[, ms_ssim]}: means over (name, image) pairs at quality q, each image compressed
    to a real file by visemz and decoded from it."""
    import visemz

    metrics = {"bpp": [], "psnr": []} | ({"ms_ssim": []} if ms_ssim else {})
    for _, img in images:
        buf = codec.compress(img, model=spec.arch, quality=q)
        rec = visemz.decompress(buf, device="cpu") if codec.device == "cpu" else codec.decompress(buf)
        metrics["bpp"].append(measure.bpp(len(buf), measure.pixel_count(img.shape)))
        metrics["psnr"].append(measure.psnr(img, rec))
        if ms_ssim:
            metrics["ms_ssim"].append(ms_ssim_of(img, rec))
    return {"images": len(images)} | {k: float(np.mean(v)) for k, v in metrics.items()}


def storage_loss(codec, model, spec, args, qualities: list[float], int8_eval: dict) -> dict:
    """PSNR (dB) and bpp that int8 kernels lose against float32 ones, on the variant's main eval set."""
    with float32_weights(model, spec):
        f32 = evaluate(codec, spec, args.data, args.limit, qualities, main_set(spec))
    name = main_set(spec)
    out = {"set": name, "images": int8_eval[name][f"{qualities[0]:g}"]["images"],
           "device": torch.cuda.get_device_name() if codec.device == "cuda" else "cpu"}
    for q in qualities:
        a, b = int8_eval[name][f"{q:g}"], f32[name][f"{q:g}"]
        out[f"{q:g}"] = {"psnr_db": round(a["psnr"] - b["psnr"], 3), "bpp_ratio": round(a["bpp"] / b["bpp"], 4)}
    return out


if __name__ == "__main__":
    main()
