"""Where the bytes of visemz's image files go, against CompressAI's rANS strings with the same weights.

    python scripts/bits_breakdown.py --data DATA/eval --out bits.json [--limit N] [--qualities 1,2,4,8]
        [--sets kodak,xray] [--xray-limit N] [--xray-qualities 1,4] [--device cpu]

For each image and quality, the visemz file (``visemz.compress`` with the hyperprior model,
mbt2018-mean, RGB for Kodak and gray for the X-rays) is split into: the container's framing
(fixed fields and section table), its JSON header (as stored), the tile index, and per part of
each tile (y, y_scales, z): its bytes, and inside a conditional rANS stream its header (with
the group sizes), lane states, escapes and coded body (``rans_layout.pieces``).  CompressAI's y and z strings
(``compress()`` of its own model carrying visemz's weights) are measured on the same image.
The summary gives, per set and quality, the mean of each piece and the ratio of the mean file
sizes (visemz / CompressAI), which is the bpp ratio compare_compressai.py reports.

Everything runs on ``--device`` (the CPU by default: the CPU and GPU codecs write the same bytes).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

import evalkit
import visemz
from visemz import container, tile_index
from visemz.encoders import rans_layout as RL
from visemz.io.writers import write_atomic
from visemz.models import architectures, registry
from visemz.models import weights as W

ARCH = "mbt2018-mean"
SETS = {"kodak": "rgb", "xray": "gray"}


def compressai_bytes(net, img: np.ndarray, quality: float, device: str) -> dict[str, int]:
    """Bytes of CompressAI's y and z strings for one image (its rANS, its tables, visemz's weights)."""
    y_strings, z_strings = evalkit.compressai_encode(net, img, quality, device)[0]["strings"]
    return {"y": sum(len(s) for s in y_strings), "z": sum(len(s) for s in z_strings)}


def file_pieces(buf: bytes) -> dict:
    """A tiled image file's (format 4 or 5) bytes by piece."""
    c = container.unpack(buf)
    sections = {k: len(v) for k, v in c.sections.items()}
    out = {"file": len(buf), "container_framing": len(buf) - c.header_bytes - sum(sections.values()),
           "header": c.header_bytes}
    t = c.meta["tiles"]
    index = tile_index.TileIndex(c.sections, t["grid"][0] * t["grid"][1], t["parts"], t["symbols"], c.meta["format"])
    out["tile_index"] = sections[tile_index.INDEX]
    parts = defaultdict(int)
    for i in range(t["grid"][0] * t["grid"][1]):
        coding = index.coding(i)
        for name in t["parts"]:
            body = index.part(i, name)
            parts[name] += len(body)
            if coding.get(name) == "rans":
                for k, v in RL.pieces(body).items():
                    parts[f"{name}.{k}"] += v
            elif name in coding:
                parts[f"{name}.ints"] += len(body)
    out["parts"] = dict(parts)
    return out


def run(data: Path, set_name: str, limit: int | None, qualities: list[float], device: str) -> list[dict]:
    spec = registry.spec(ARCH, SETS[set_name])
    net, _ = W.load(spec, device)
    ref = architectures.build(spec).to(device).eval()
    ref.load_state_dict(net.state_dict())
    ref.update(force=True)  # CompressAI's CDF tables for its rANS coder
    codec = visemz.ImageCodec(device)
    images = evalkit.load_folder(data / set_name, gray=SETS[set_name] == "gray", limit=limit)
    rows = []
    for q in qualities:
        for name, img in images:
            buf = codec.compress(img, model=ARCH, quality=q)
            row = {"set": set_name, "image": name, "quality": q, "shape": list(img.shape),
                   "visemz": file_pieces(buf), "compressai": compressai_bytes(ref, img, q, device)}
            row["compressai"]["total"] = row["compressai"]["y"] + row["compressai"]["z"]
            row["ratio"] = round(row["visemz"]["file"] / row["compressai"]["total"], 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per set and quality: mean bytes of every piece, and visemz's mean file over CompressAI's mean total."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["set"], r["quality"])].append(r)
    out = []
    for (set_name, q), rs in sorted(groups.items()):
        def mean(get):
            return round(float(np.mean([get(r) for r in rs])), 1)

        pieces = {k: mean(lambda r, k=k: r["visemz"][k]) for k in ("file", "container_framing", "header", "tile_index")}
        for k in sorted({k for r in rs for k in r["visemz"]["parts"]}):
            pieces[k] = mean(lambda r, k=k: r["visemz"]["parts"].get(k, 0))
        ca = {k: mean(lambda r, k=k: r["compressai"][k]) for k in ("y", "z", "total")}
        out.append({"set": set_name, "quality": q, "images": len(rs), "visemz": pieces, "compressai": ca,
                    "ratio_of_means": round(pieces["file"] / ca["total"], 4),
                    "overhead_bytes": round(pieces["file"] - ca["total"], 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder holding kodak/ and xray/, e.g. DATA/eval")
    ap.add_argument("--out", default="bits_breakdown.json")
    ap.add_argument("--sets", default="kodak,xray")
    ap.add_argument("--limit", type=int, default=None, help="first N Kodak images")
    ap.add_argument("--qualities", default="1,2,4,8", help="Kodak qualities, comma-separated")
    ap.add_argument("--xray-limit", type=int, default=2, help="first N X-rays")
    ap.add_argument("--xray-qualities", default="1,4")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    rows = []
    for set_name in args.sets.split(","):
        xray = set_name == "xray"
        qualities = [float(q) for q in (args.xray_qualities if xray else args.qualities).split(",")]
        rows += run(args.data, set_name, args.xray_limit if xray else args.limit, qualities, args.device)
    summary = summarise(rows)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    write_atomic(Path(args.out), json.dumps({"device": device, "summary": summary, "rows": rows}, indent=1).encode())
    print("| set | q | visemz B | CompressAI B | ratio | overhead B | framing | header | index | y rANS header | "
          "y lane states | y escapes | z |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        v = s["visemz"]
        print(f"| {s['set']} | {s['quality']:g} | {v['file']} | {s['compressai']['total']} | {s['ratio_of_means']} | "
              f"{s['overhead_bytes']} | {v['container_framing']} | {v['header']} | {v['tile_index']} | "
              f"{v.get('y.header', 0)} | {v.get('y.lane_states', 0)} | {v.get('y.escapes', 0)} | {v.get('z', 0)} |")


if __name__ == "__main__":
    main()
