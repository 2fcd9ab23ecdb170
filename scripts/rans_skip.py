"""Skipped symbols in the conditional rANS coder (stream version 3): bytes, sequential steps and coding time.

    python scripts/rans_skip.py --data DATA/eval --models mbt2018-mean --qualities 1,2,3,4,5,6,7,8 \
        --skips 0,65533,65531,65511 --device cpu --reps 1 --out rans_skip.jsonl

For every image under --data (its sub-folders are the sets: eval/kodak, eval/xray; RGB images go to the rgb
models, gray ones to the gray models), model and quality, each symbol section that format 3 codes by rANS (the
hyperprior model's z and y, the factorized model's y) is coded at every --skips threshold (0: none skipped,
stream version 2; else version 3, the symbols whose table's zero frequency is at least the threshold left out
of the lanes, ``VISEMZ_RANS_SKIP_FREQ``): its bytes, lanes, steps per lane (what the GPU coder's latency
follows), coded symbols, listed exceptions, and the median milliseconds of its encode and of its decode
(``--reps`` runs after a warm-up, synchronised on a GPU).  Every stream is decoded and checked against the
symbols.  One JSON line per image, model, quality, section and threshold, then a summary per set, model,
quality and threshold: the sections' bytes over threshold 0's, y's steps (sum over the images) over threshold
0's, and the coding time over threshold 0's (same run).  The device is printed and stored.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

import evalkit
from visemz import ImageCodec, latents, measure
from visemz import device as dev
from visemz.codec import network_math
from visemz.encoders import rans_layout as RL
from visemz.encoders.rans import decode_conditional, encode_conditional


def sections(codec: ImageCodec, img, model: str, quality: float) -> dict[str, tuple]:
    """{section: (symbols, table indexes, tables, lane_symbols)} of what format 3 codes by rANS."""
    net, net64, symbols = evalkit.latent_symbols(codec, img, model, quality)
    with network_math():
        coded, _ = latents.rans_inputs(net, net64, symbols, quality)
    return coded


def measure_section(sym, idx, tables, lanes, skip: int, reps: int, sync) -> dict:
    """One section coded at one threshold: sizes, plan and medians of encode and decode (checked)."""
    enc_s, buf = measure.median_seconds(lambda: encode_conditional(sym, idx, tables, lane_symbols=lanes,
                                                                   skip_freq=skip),
                                        reps, warmup=1, sync=sync)
    dec_s, back = measure.median_seconds(lambda: decode_conditional(buf, idx, tables), reps, warmup=1, sync=sync)
    if not np.array_equal(dev.as_numpy(back).reshape(-1), dev.as_numpy(sym).reshape(-1)):
        raise AssertionError(f"skip {skip}: the stream does not decode to its symbols")
    parsed = RL.parse(buf, None, None)
    p = parsed.plan
    return {"bytes": len(buf), "lanes": p.lanes * p.groups, "steps": p.steps, "coded": p.n,
            "symbols": int(np.prod(idx.shape)), "exceptions": int(parsed.skip.positions.size),
            "encode_ms": round(1e3 * enc_s, 3), "decode_ms": round(1e3 * dec_s, 3)}


def summarise(rows: list[dict]) -> list[dict]:
    acc = defaultdict(lambda: defaultdict(float))
    for r in rows:
        a = acc[(r["set"], r["model"], r["quality"], r["skip"])]
        a["images"] += r["section"] == "y"
        a["bytes"] += r["bytes"]
        a["y_steps"] += r["steps"] if r["section"] == "y" else 0
        a["ms"] += r["encode_ms"] + r["decode_ms"]
    out = []
    for (set_name, model, quality, skip), a in sorted(acc.items()):
        base = acc.get((set_name, model, quality, 0))
        row = {"set": set_name, "model": model, "quality": quality, "skip": skip, "images": int(a["images"]),
               "bytes": int(a["bytes"]), "y_steps": int(a["y_steps"]), "coding_ms": round(a["ms"], 2)}
        if base and skip:
            row.update(bytes_ratio=round(a["bytes"] / base["bytes"], 4),
                       y_steps_ratio=round(a["y_steps"] / max(base["y_steps"], 1), 4),
                       coding_time_ratio=round(a["ms"] / base["ms"], 3))
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a folder whose sub-folders are the image sets")
    ap.add_argument("--models", default="mbt2018-mean")
    ap.add_argument("--qualities", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--skips", default="0,65533,65531,65511", help="thresholds; 0 (none skipped) is the baseline")
    ap.add_argument("--limit", type=int, default=None, help="first N images of each set")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per coding, after one warm-up")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("rans_skip.jsonl"))
    args = ap.parse_args(argv)
    skips = sorted({0, *(int(v) for v in args.skips.split(","))})
    codec = ImageCodec(args.device)
    sync = torch.cuda.synchronize if codec.device.startswith("cuda") else None
    name = torch.cuda.get_device_name() if sync else "CPU"
    print(f"device: {name}", flush=True)
    rows = []
    for set_name, path, img, model, q in evalkit.set_cases(args.data, args.models, args.qualities, args.limit):
        for section, (sym, idx, tables, lanes) in sections(codec, img, model, q).items():
            for skip in skips:
                row = {"set": set_name, "image": path.name, "model": model, "quality": q, "section": section,
                       "skip": skip, **measure_section(sym, idx, tables, lanes, skip, args.reps, sync)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = summarise(rows)
    evalkit.write_jsonl(args.out, rows, summary, {"device": name})
    return summary


if __name__ == "__main__":
    main()
