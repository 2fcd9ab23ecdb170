"""Alpha-beta model of all_reduce time at scale, from the collectives benchmark's JSON (a model, not a measurement).

    python tools/cost_model.py socket.json --bytes 1073741824 --case image/eb=0.0001
    python tools/cost_model.py codecs.json --measured collectives_socket_2gpu.json   # fit, check, extrapolate
    python tools/cost_model.py codecs.json --measured socket_2gpu.json socket_4gpu.json  # one fit over both
    python tools/cost_model.py codecs.json --measured socket_2gpu.json --check socket_4gpu.json  # fit on 2, predict 4

The lines are ``visemz.collectives.cost.CostModel.analytic``, the same model ``auto`` chooses
with (there fitted to timings on the group, here built from first principles).  A plain ring
all_reduce of S bytes over W GPUs (Thakur et al.; nccl-tests' busbw) costs 2 (W - 1) alpha +
2 (W - 1) / W * S / B.  The compressed algorithms move S / r bytes (r the measured ratio) in
messages that each carry a size word first (twice the messages), and add codec time at the
measured GB/s of one GPU: one encode and one decode of S, plus (W - 1) / W * S of homomorphic
adds for the ring, log2 W * S for recursive doubling.  Link bandwidths B are given (100 and
200 Gb/s per GPU); alpha defaults to 5 us per message.

``--measured`` takes a visemz.benchmarks.collectives JSON of all_reduce rows on a real group (the
codec rows of the first JSON must cover its error bounds): the link bandwidth is fitted to
NCCL's time at the largest size, then two corrections the first-principles lines lack
(seconds per compressed exchange; how much slower the codec runs inside a collective) are
fitted by least squares on the ring and recursive-doubling rows, each row printed with
the measured time beside the uncorrected and corrected model, and the extrapolation uses
the corrected lines.  Several ``--measured`` JSONs (e.g. 2 and 4 GPUs) are fitted together;
``--check`` JSONs are not fitted to, only compared with the fitted model (an out-of-sample check).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from visemz.collectives.cost import CostModel, exchanges, fit_corrections

WORLDS = [8, 16, 32, 64, 128, 256, 512]


def model(world: int, alpha: float, bw: float, c: dict, corrections: tuple[float, float] = (0.0, 1.0)) -> CostModel:
    """The model of ``world`` GPUs on links of ``bw`` bytes/s with the codec figures ``c`` (a bench row),
    with ``corrections`` = (seconds per compressed exchange, codec slow-down) applied."""
    return CostModel.analytic(world, alpha, 1 / bw, c["ratio"], c["encode_GBps"] * 1e9, c["decode_GBps"] * 1e9,
                              c["homomorphic_add_GBps"] * 1e9, *corrections)


COMPRESSED = ("ring", "recursive_doubling")


def codec_row(codecs: dict, kind: str, row: dict) -> dict | None:
    """The codec row a measured all_reduce ran with: keyed by data, eb and predictor
    ('image/eb=0.0001/lorenzo'); rows of JSONs written before predictors ('image/eb=0.0001') are
    the codec without prediction."""
    base = f"{kind}/eb={row['eb']:g}"
    predictor = row.get("predictor") or "none"
    return codecs.get(f"{base}/{predictor}") or (codecs.get(base) if predictor == "none" else None)


def measured_rows(measured: dict, codecs: dict, kind: str,
                  api: str | None = None) -> tuple[float, list[tuple[dict, dict]]]:
    """(link bytes/s fitted to NCCL at the largest size, [(compressed all_reduce row, its codec row)]);
    ``api`` keeps the rows of one API (functional, plan) where the JSON has both."""
    rows = [r for r in measured["rows"] if r["op"] == "all_reduce" and r["data"] == kind
            and (api is None or r.get("api", api) == api)]
    if not rows:
        raise SystemExit(f"no all_reduce rows of {kind!r} data in the measured JSON")
    nccl = max((r for r in rows if r["algorithm"] == "nccl"), key=lambda r: r["bytes"], default=None)
    if nccl is None:
        raise SystemExit("the measured JSON has no NCCL all_reduce rows to fit the link to")
    world = int(measured["world"])
    bw = nccl["bytes"] * 2 * (world - 1) / world / nccl["seconds"]  # ring: 2 (W-1)/W S on the wire
    pairs = [(r, c) for r in rows if r["algorithm"] in COMPRESSED and (c := codec_row(codecs, kind, r)) is not None]
    if len(pairs) < 2:
        raise SystemExit(f"the codec rows ({sorted(codecs)}) cover fewer than 2 measured compressed rows")
    return bw, pairs


def fit(groups: list[tuple[int, float, list]], alpha: float) -> tuple[float, float]:
    """The corrections fitted over every (world, link bytes/s, pairs) group at once."""
    return fit_corrections([s for world, bw, pairs in groups for s in samples(world, alpha, bw, pairs)])


def samples(world: int, alpha: float, bw: float, pairs: list) -> list[tuple]:
    out = []
    for r, c in pairs:
        m = model(world, alpha, bw, c)
        cost = m.costs[r["algorithm"]]
        wire = r["bytes"] * cost.wire * m.link / m.ratio
        out.append((r["seconds"] - cost.latency - wire, exchanges(r["algorithm"], world), r["bytes"] * cost.codec,
                    1 / r["seconds"]))
    return out


def check_table(world: int, alpha: float, bw: float, pairs: list, corr: tuple[float, float]) -> str:
    lines = ["| algorithm | MB | eb | predictor | measured ms | model ms | corrected model ms |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for r, c in sorted(pairs, key=lambda p: (p[0]["algorithm"], p[0]["bytes"], -p[0]["eb"],
                                             p[0].get("predictor") or "")):
        raw, fixed = (model(world, alpha, bw, c, k).seconds(r["algorithm"], r["bytes"]) for k in ((0.0, 1.0), corr))
        lines.append(f"| {r['algorithm']} | {r['bytes'] / 2**20:.0f} | {r['eb']:g} | {r.get('predictor') or 'none'} "
                     f"| {r['seconds'] * 1e3:.2f} "
                     f"| {raw * 1e3:.2f} | {fixed * 1e3:.2f} |")
    return "\n".join(lines)


def plain_seconds(size: float, world: int, alpha: float, bw: float) -> float:
    free = {"ratio": 1.0, "encode_GBps": float("inf"), "decode_GBps": float("inf"),
            "homomorphic_add_GBps": float("inf")}
    return model(world, alpha, bw, free).seconds("plain", size)


def compressed_seconds(size: float, world: int, alpha: float, bw: float, c: dict, algorithm: str = "ring") -> float:
    return model(world, alpha, bw, c).seconds(algorithm, size)


def table(c: dict, size: float, alpha: float, gbits: list[float], worlds: list[int],
          corr: tuple[float, float] = (0.0, 1.0)) -> str:
    header = ("| GPUs | link Gb/s | NCCL ring (model) ms | compressed ring (model) ms | speedup (model) "
              "| recursive doubling (model) ms | model's choice |")
    lines = [header, "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for g in gbits:
        bw = g * 1e9 / 8
        for w in worlds:
            m = model(w, alpha, bw, c, corr)
            p, q, d = (m.seconds(a, size) for a in ("plain", "ring", "recursive_doubling"))
            lines.append(f"| {w} | {g:g} | {p * 1e3:.1f} | {q * 1e3:.1f} | {p / q:.2f}x | {d * 1e3:.1f} | "
                         f"{m.choose(size)} |")
    return "\n".join(lines)


def group(path: Path, codecs: dict, args) -> tuple[str, int, float, list]:
    """(file name, world size, link bytes/s, [(row, codec row)]) of a measured JSON."""
    measured = json.loads(path.read_text())
    bw, pairs = measured_rows(measured, codecs, args.kind, args.api)
    return path.name, int(measured["world"]), bw, pairs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", type=Path, help="JSON written by visemz.benchmarks.collectives (its 'codecs' section)")
    ap.add_argument("--case", default="image/eb=0.0001", help="which measured codec row to use")
    ap.add_argument("--bytes", type=float, default=float(1 << 30), help="all_reduce size S in bytes")
    ap.add_argument("--alpha-us", type=float, default=5.0, help="latency per message, microseconds")
    ap.add_argument("--measured", type=Path, nargs="+",
                    help="visemz.benchmarks.collectives JSONs of all_reduce rows to fit corrections to")
    ap.add_argument("--check", type=Path, nargs="+", default=[],
                    help="JSONs whose rows are compared with the fit, not fitted to")
    ap.add_argument("--kind", default="image", help="data kind of the measured rows to fit on")
    ap.add_argument("--api", choices=("functional", "plan"), help="fit on the measured rows of this API only")
    args = ap.parse_args(argv)
    report = json.loads(args.bench.read_text())
    codecs = report.get("codecs") or {}
    if args.case not in codecs:
        raise SystemExit(f"{args.bench} has no codec row {args.case!r}; it has {sorted(codecs)}")
    c = codecs[args.case]
    alpha = args.alpha_us * 1e-6
    corr = (0.0, 1.0)
    if args.measured:
        fitted = [group(path, codecs, args) for path in args.measured]
        corr = fit([g[1:] for g in fitted], alpha)
        print(f"Fitted to {sum(len(g[3]) for g in fitted)} measured compressed all_reduces "
              f"({', '.join(f'{g[0]}, {g[1]} GPUs' for g in fitted)}): {corr[0] * 1e3:.2f} ms per compressed exchange, "
              f"codec work {corr[1]:.2f}x its kernel benchmark's time\n")
        for label, path in [("fitted", p) for p in args.measured] + [("not fitted to", p) for p in args.check]:
            name, world, bw, pairs = group(path, codecs, args)
            print(f"{name} ({label}): {world}x {json.loads(path.read_text()).get('device')}, link {bw * 8 / 1e9:.1f} "
                  f"Gb/s from NCCL\n\n" + check_table(world, alpha, bw, pairs, corr) + "\n")
    label = "alpha-beta with measured corrections" if args.measured else "alpha-beta"
    print(f"**Model** ({label}, not measured): all_reduce of {args.bytes / 2**20:.0f} MiB, alpha {args.alpha_us} us; "
          f"codec figures measured on {report.get('device')} ({args.case}: ratio {c['ratio']:.2f}, encode "
          f"{c['encode_GBps']:.0f} GB/s, decode {c['decode_GBps']:.0f} GB/s, homomorphic add "
          f"{c['homomorphic_add_GBps']:.0f} GB/s)\n")
    print(table(c, args.bytes, alpha, [100, 200], WORLDS, corr))


if __name__ == "__main__":
    main()
