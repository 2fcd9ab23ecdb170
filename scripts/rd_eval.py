"""Rate-distortion report over the evaluation sets (the same function as ``visemz eval``).

    python scripts/rd_eval.py --data DATA/eval --out report/ --device cuda [--limit N] \
        [--datasets kodak,xray] [--codecs jpeg,jpeg2000,...] [--refine-steps 100] \
        [--ladder visemz-mbt2018-mean-refine100=1,2,4,8]

Writes OUT/points.csv (every point; a rerun skips points already there), OUT/summary.md
(BD tables against JPEG, JPEG 2000 and WebP), OUT/rd_<dataset>.png and OUT/crops_<dataset>.png.
``--refine-steps N`` adds codec visemz-<arch>-refine<N> (N steps of encoder-side latent
refinement, ``visemz/refine.py``) beside each visemz-<arch> of the selection, measured like every
other codec, and summary.md gives what the steps cost per image; a refined codec can also be
named in ``--codecs`` directly.  ``--ladder CODEC=V1,V2,...`` (repeatable) replaces a codec's
settings (qualities for the learned codecs).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from visemz.device import resolve
from visemz.errors import InvalidArgumentError
from visemz.evaluation.runner import EvalConfig, evaluate


def parse_ladder(text: str) -> tuple[str, tuple]:
    """'CODEC=V1,V2,...' -> (CODEC, (V1, V2, ...)): whole numbers as int, others as float."""
    name, sep, values = text.partition("=")
    try:
        nums = tuple(float(v) for v in values.split(","))
    except ValueError:
        nums = ()
    if not sep or not name or not nums:
        raise InvalidArgumentError(f"--ladder {text!r}: expected CODEC=V1,V2,... with numbers")
    return name, tuple(int(v) if v.is_integer() else v for v in nums)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the evaluation folder, e.g. DATA/eval: one sub-folder of images per set (kodak/, xray/)")
    ap.add_argument("--out", type=Path, default=Path("report"))
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--limit", type=int, default=None, help="first N images of each dataset")
    ap.add_argument("--datasets", default=None, help="comma-separated sub-folders of --data (default: all)")
    ap.add_argument("--codecs", default=None, help="comma-separated codec names (default: all usable on the device)")
    ap.add_argument("--refine-steps", type=int, default=0,
                    help="also run visemz-<arch>-refine<N> beside each visemz-<arch> codec (default 0: none)")
    ap.add_argument("--ladder", action="append", default=[], metavar="CODEC=V1,V2,...",
                    help="replace a codec's settings, e.g. visemz-mbt2018-mean-refine100=1,2,4,8 (repeatable)")
    ap.add_argument("--no-crops", action="store_true")
    args = ap.parse_args(argv)
    split = lambda s: tuple(s.split(",")) if s else None  # noqa: E731
    cfg = EvalConfig(codecs=split(args.codecs), device=resolve(args.device), limit=args.limit,
                     datasets=split(args.datasets), crops=not args.no_crops, refine_steps=args.refine_steps,
                     ladders=tuple(parse_ladder(t) for t in args.ladder))
    t0 = time.perf_counter()
    result = evaluate(args.data, args.out, cfg, log=lambda m: print(m, flush=True))
    print(f"{result.computed} points computed, {result.skipped} skipped, {len(result.failures)} failed "
          f"in {time.perf_counter() - t0:.1f} s; report in {args.out}")


if __name__ == "__main__":
    main()
