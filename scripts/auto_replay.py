"""Replay ``all_reduce(algorithm="auto")``'s choice on the timings of a bench_collectives.py JSON.

    python scripts/auto_replay.py collectives_nvlink_4gpu.json --calibration-mb 1,256

``auto`` calibrates by timing plain, ring and recursive doubling at two sizes and fitting a line
per algorithm (``visemz.collectives.cost.CostModel.from_timings``).  This script builds the
same model from the JSON's own rows at two of its sizes (NCCL's row stands for plain; the
compressed rows of ``--api``), with the compression ratio ``auto`` observed there, and for
every size, data kind and error bound prints what the model chooses, that choice's measured
speedup over NCCL, and the algorithm that was measured fastest.  It replays measured timings
(no GPU, no communication): a check of calibration sizes against a run, not a new measurement.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from visemz.collectives.cost import ALGORITHMS, CostModel

MB = 1 << 20


def _ours(r: dict, api: str, predictor: str) -> bool:
    """A compressed all_reduce row of this API and predictor (rows without the field were written by one)."""
    return r["op"] == "all_reduce" and r.get("api", api) == api and r.get("predictor", predictor) == predictor


def timings(rows: list[dict], api: str, predictor: str) -> dict:
    """(kind, eb, algorithm, MiB) -> seconds; plain is NCCL's row (its eb None)."""
    out = {}
    for r in rows:
        if r["op"] == "all_reduce" and r["algorithm"] == "nccl":
            out[(r["data"], None, "plain", r["bytes"] // MB)] = r["seconds"]
        elif r["algorithm"] in ALGORITHMS[1:] and _ours(r, api, predictor):
            out[(r["data"], r["eb"], r["algorithm"], r["bytes"] // MB)] = r["seconds"]
    return out


def observed_ratio(rows: list[dict], kind: str, eb: float, api: str, predictor: str) -> float | None:
    """The last compression ratio auto recorded for this case (None if no auto row has one)."""
    seen = [r["auto_ratio"] for r in rows if r["algorithm"] == "auto" and _ours(r, api, predictor)
            and r["data"] == kind and r["eb"] == eb and r.get("auto_ratio")]
    return seen[-1] if seen else None


def replay(rows: list[dict], cal: tuple[int, int], api: str, predictor: str = "lorenzo") -> list[str]:
    t = timings(rows, api, predictor)
    world = max(r["world"] for r in rows)
    lines = []
    cases = sorted({(k, eb) for k, eb, a, _ in t if a != "plain"})
    sizes = sorted({mb for *_, mb in t})
    if not cases:
        return [f"no compressed all_reduce rows of the {api} API with predictor {predictor}"]
    for kind, eb in cases:
        ratio = observed_ratio(rows, kind, eb, api, predictor)

        def sec(a, mb, kind=kind, eb=eb):
            return t.get((kind, None if a == "plain" else eb, a, mb))

        if ratio is None or any(sec(a, mb) is None for a in ALGORITHMS for mb in cal):
            lines.append(f"{kind} eb={eb:g}: no auto ratio or no rows at {cal} MiB")
            continue
        m = CostModel.from_timings(world, (cal[0] * MB, cal[1] * MB),
                                   {a: (sec(a, cal[0]), sec(a, cal[1])) for a in ALGORITHMS}, ratio)
        cells = []
        for mb in sizes:
            if any(sec(a, mb) is None for a in ALGORITHMS):
                continue
            chosen = m.choose(mb * MB, ratio)
            best = min(ALGORITHMS, key=lambda a, mb=mb: sec(a, mb))
            cells.append(f"{mb} MiB: {chosen} {sec('plain', mb) / sec(chosen, mb):.2f}x (best {best} "
                         f"{sec('plain', mb) / sec(best, mb):.2f}x)")
        lines.append(f"{kind} eb={eb:g} ratio {ratio:.1f}: " + "; ".join(cells))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", type=Path, nargs="+", help="JSON written by scripts/bench_collectives.py")
    ap.add_argument("--calibration-mb", default="1,256", help="the two calibration sizes in MiB (sizes the JSON has; "
                    "auto's default is 1 and 256)")
    ap.add_argument("--api", default="plan", choices=("plan", "functional"), help="whose compressed rows to use")
    ap.add_argument("--predictor", default="lorenzo", help="whose compressed rows to use (none, lorenzo)")
    args = ap.parse_args()
    try:
        cal = tuple(int(s) for s in args.calibration_mb.split(","))
    except ValueError:
        cal = ()
    if len(cal) != 2 or not 0 < cal[0] < cal[1]:
        ap.error(f"--calibration-mb {args.calibration_mb!r}: expected two sizes in MiB, the smaller first")
    for path in args.bench:
        data = json.loads(path.read_text())
        print(f"== {path.name} ({data.get('device')}, {data.get('label')}), calibration at {cal[0]} and {cal[1]} MiB")
        for line in replay(data["rows"], cal, args.api, args.predictor):
            print(line)


if __name__ == "__main__":
    main()
