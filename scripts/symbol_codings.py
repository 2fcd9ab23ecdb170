"""Each symbol section's two codings side by side: conditional rANS and the format-2 ints stream.

    python scripts/symbol_codings.py --data DATA/eval --models mbt2018-mean,balle2016 \
        --qualities 1,2,3,4,5,6,7,8 --device cpu --out symbol_codings.jsonl

For every image under --data (its sub-folders are the sets: eval/kodak, eval/xray; RGB images go to the rgb
models, gray ones to the gray models), model and quality: the bytes of each symbol section (y, and z for the
hyperprior model) coded by rANS with the model's prior and as an ints stream (block encoder + the entropy
stage), whichever format 3 would keep.  One JSON line per image, model and quality, and a summary per model,
section and set: the ratio ints / rANS (min, max) and how often the ints stream is the smaller.  This is the
measurement behind ``latents.tries_ints`` (a hyperprior model's y is coded by rANS alone, its z tried as an
ints stream only when at least ``latents.Z_INTS_MIN_ZEROS`` of its symbols are 0: each row has z's share of
zeros, ``z_zeros``).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

import evalkit
from visemz import ImageCodec, latents
from visemz import device as dev
from visemz.codec import network_math
from visemz.encoders import EncoderConfig, encode_ints_many


def sizes(codec: ImageCodec, img, model: str, quality: float) -> tuple[dict[str, tuple[int, int]], float | None]:
    """({section: (rANS bytes, ints-stream bytes)}, the share of z's symbols that are 0 or None) for one image
    (one tile)."""
    net, net64, symbols = evalkit.latent_symbols(codec, img, model, quality)
    with network_math():
        rans = latents._encode_rans(net, net64, symbols, quality)
        cfg = EncoderConfig(latents.SYMBOL_POLICY, **codec.enc)
        ints = encode_ints_many([(dev.torch_to_ints(s), cfg) for s in symbols.values()])
    zeros = latents.zero_share(symbols["z"]) if "z" in symbols else None
    return {k: (len(rans[k]), len(b)) for k, b in zip(symbols, ints)}, zeros


def summarise(rows: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for r in rows:
        for k, (r_bytes, i_bytes) in r["sections"].items():
            groups[(r["model"], k, r["set"])].append(i_bytes / r_bytes)
    return [{"model": m, "section": k, "set": s, "cases": len(v), "ints_over_rans_min": round(min(v), 3),
             "ints_over_rans_max": round(max(v), 3), "ints_smaller": sum(x < 1 for x in v)}
            for (m, k, s), v in sorted(groups.items())]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a folder whose sub-folders are the image sets")
    ap.add_argument("--models", default="mbt2018-mean,balle2016")
    ap.add_argument("--qualities", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("symbol_codings.jsonl"))
    args = ap.parse_args(argv)
    codec = ImageCodec(args.device)
    rows = []
    for set_name, path, img, model, q in evalkit.set_cases(args.data, args.models, args.qualities):
        sections, zeros = sizes(codec, img, model, q)
        row = {"set": set_name, "image": path.name, "model": model, "quality": q, "sections": sections}
        if zeros is not None:
            row["z_zeros"] = round(zeros, 6)
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = summarise(rows)
    evalkit.write_jsonl(args.out, rows, summary)
    return summary


if __name__ == "__main__":
    main()
