"""Alpha-beta model of all_reduce time at scale, from a bench_collectives.py JSON (a model, not a measurement).

    python scripts/cost_model.py socket.json --bytes 1073741824 --case image/eb=0.0001

The lines are ``visemz.collectives.cost.CostModel.analytic``, the same model ``auto`` chooses
with (there fitted to timings on the group, here built from first principles).  A plain ring
all_reduce of S bytes over W GPUs (Thakur et al.; nccl-tests' busbw) costs 2 (W - 1) alpha +
2 (W - 1) / W * S / B.  The compressed algorithms move S / r bytes (r the measured ratio) in
messages that each carry a size word first (twice the messages), and add codec time at the
measured GB/s of one GPU: one encode and one decode of S, plus (W - 1) / W * S of homomorphic
adds for the ring, log2 W * S for recursive doubling.  Link bandwidths B are given (100 and
200 Gb/s per GPU); alpha defaults to 5 us per message.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from visemz.collectives.cost import CostModel

WORLDS = [8, 16, 32, 64, 128, 256, 512]


def model(world: int, alpha: float, bw: float, c: dict) -> CostModel:
    """The model of ``world`` GPUs on links of ``bw`` bytes/s with the codec figures ``c`` (a bench row)."""
    return CostModel.analytic(world, alpha, 1 / bw, c["ratio"], c["encode_GBps"] * 1e9, c["decode_GBps"] * 1e9,
                              c["homomorphic_add_GBps"] * 1e9)


def plain_seconds(size: float, world: int, alpha: float, bw: float) -> float:
    free = {"ratio": 1.0, "encode_GBps": float("inf"), "decode_GBps": float("inf"), "homomorphic_add_GBps": float("inf")}
    return model(world, alpha, bw, free).seconds("plain", size)


def compressed_seconds(size: float, world: int, alpha: float, bw: float, c: dict, algorithm: str = "ring") -> float:
    return model(world, alpha, bw, c).seconds(algorithm, size)


def table(c: dict, size: float, alpha: float, gbits: list[float], worlds: list[int]) -> str:
    header = ("| GPUs | link Gb/s | NCCL ring (model) ms | compressed ring (model) ms | speedup (model) "
              "| recursive doubling (model) ms | model's choice |")
    lines = [header, "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for g in gbits:
        bw = g * 1e9 / 8
        for w in worlds:
            m = model(w, alpha, bw, c)
            p, q, d = (m.seconds(a, size) for a in ("plain", "ring", "recursive_doubling"))
            lines.append(f"| {w} | {g:g} | {p * 1e3:.1f} | {q * 1e3:.1f} | {p / q:.2f}x | {d * 1e3:.1f} | {m.choose(size)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", type=Path, help="JSON written by scripts/bench_collectives.py (its 'codecs' section)")
    ap.add_argument("--case", default="image/eb=0.0001", help="which measured codec row to use")
    ap.add_argument("--bytes", type=float, default=float(1 << 30), help="all_reduce size S in bytes")
    ap.add_argument("--alpha-us", type=float, default=5.0, help="latency per message, microseconds")
    args = ap.parse_args()
    report = json.loads(args.bench.read_text())
    codecs = report.get("codecs") or {}
    if args.case not in codecs:
        raise SystemExit(f"{args.bench} has no codec row {args.case!r}; it has {sorted(codecs)}")
    c = codecs[args.case]
    print(f"**Model** (alpha-beta, not measured): all_reduce of {args.bytes / 2**20:.0f} MiB, alpha {args.alpha_us} us; "
          f"codec figures measured on {report.get('device')} ({args.case}: ratio {c['ratio']:.2f}, encode "
          f"{c['encode_GBps']:.0f} GB/s, decode {c['decode_GBps']:.0f} GB/s, homomorphic add {c['homomorphic_add_GBps']:.0f} GB/s)\n")
    print(table(c, args.bytes, args.alpha_us * 1e-6, [100, 200], WORLDS))


if __name__ == "__main__":
    main()
