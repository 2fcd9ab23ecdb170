"""Alpha-beta model of all_reduce time at scale, from a bench_collectives.py JSON (a model, not a measurement).

    python scripts/cost_model.py socket.json --bytes 1073741824 --case image/eb=0.0001

Per the classic ring analysis (Thakur et al.; nccl-tests' busbw), a plain ring all_reduce of S
bytes over W GPUs costs 2 (W - 1) alpha + 2 (W - 1) / W * S / B.  The compressed ring sends S / r
bytes (r the measured ratio) and adds codec time: one encode of S, W - 1 homomorphic adds of
S / W, and one decode of S (the ring of ops.py), at the measured GB/s of one GPU.  Link
bandwidths B are given (100 and 200 Gb/s per GPU); alpha defaults to 5 us per step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def plain_seconds(size: float, world: int, alpha: float, bw: float) -> float:
    return 2 * (world - 1) * alpha + 2 * (world - 1) / world * size / bw


def compressed_seconds(size: float, world: int, alpha: float, bw: float, c: dict) -> float:
    codec = size / (c["encode_GBps"] * 1e9) + size / (c["decode_GBps"] * 1e9)
    codec += (world - 1) * (size / world) / (c["homomorphic_add_GBps"] * 1e9)
    return plain_seconds(size / c["ratio"], world, alpha, bw) + codec


def table(c: dict, size: float, alpha: float, gbits: list[float], worlds: list[int]) -> str:
    lines = ["| GPUs | link Gb/s | NCCL ring (model) ms | compressed ring (model) ms | speedup (model) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for g in gbits:
        bw = g * 1e9 / 8
        for w in worlds:
            p, q = plain_seconds(size, w, alpha, bw), compressed_seconds(size, w, alpha, bw, c)
            lines.append(f"| {w} | {g:g} | {p * 1e3:.1f} | {q * 1e3:.1f} | {p / q:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", type=Path, help="JSON written by scripts/bench_collectives.py (its 'codecs' section)")
    ap.add_argument("--case", default="image/eb=0.0001", help="which measured codec row to use")
    ap.add_argument("--bytes", type=float, default=float(1 << 30), help="all_reduce size S in bytes")
    ap.add_argument("--alpha-us", type=float, default=5.0, help="latency per ring step, microseconds")
    args = ap.parse_args()
    report = json.loads(args.bench.read_text())
    codecs = report.get("codecs") or {}
    if args.case not in codecs:
        raise SystemExit(f"{args.bench} has no codec row {args.case!r}; it has {sorted(codecs)}")
    c = codecs[args.case]
    print(f"**Model** (alpha-beta, not measured): all_reduce of {args.bytes / 2**20:.0f} MiB, alpha {args.alpha_us} us; "
          f"codec figures measured on {report.get('device')} ({args.case}: ratio {c['ratio']:.2f}, encode "
          f"{c['encode_GBps']:.0f} GB/s, decode {c['decode_GBps']:.0f} GB/s, homomorphic add {c['homomorphic_add_GBps']:.0f} GB/s)\n")
    print(table(c, args.bytes, args.alpha_us * 1e-6, [100, 200], [8, 16, 32, 64, 128, 256, 512]))


if __name__ == "__main__":
    main()
