"""Rate-distortion report over the evaluation sets (the same function as ``visemz eval``).

    python scripts/rd_eval.py --data ../shared/data/eval --out report/ --device cuda [--limit N] \
        [--datasets kodak,xray] [--codecs jpeg,jpeg2000,...]

Writes OUT/points.csv (every point; a rerun skips points already there), OUT/summary.md
(BD tables against JPEG, JPEG 2000 and WebP), OUT/rd_<dataset>.png and OUT/crops_<dataset>.png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from visemz.device import resolve
from visemz.evaluation.runner import EvalConfig, evaluate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/eval"))
    ap.add_argument("--out", type=Path, default=Path("report"))
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--limit", type=int, default=None, help="first N images of each dataset")
    ap.add_argument("--datasets", default=None, help="comma-separated sub-folders of --data (default: all)")
    ap.add_argument("--codecs", default=None, help="comma-separated codec names (default: all usable on the device)")
    ap.add_argument("--no-crops", action="store_true")
    args = ap.parse_args()
    split = lambda s: tuple(s.split(",")) if s else None  # noqa: E731
    cfg = EvalConfig(codecs=split(args.codecs), device=resolve(args.device), limit=args.limit,
                     datasets=split(args.datasets), crops=not args.no_crops)
    t0 = time.perf_counter()
    result = evaluate(args.data, args.out, cfg, log=lambda m: print(m, flush=True))
    print(f"{result.computed} points computed, {result.skipped} skipped, {len(result.failures)} failed "
          f"in {time.perf_counter() - t0:.1f} s; report in {args.out}")


if __name__ == "__main__":
    main()
