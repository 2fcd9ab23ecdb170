"""The evaluation over folders of images: the same function as ``visemz eval``, with ``--ladder``.

    python scripts/rd_eval.py --data EVAL_FOLDER --out report/ --device cuda [--limit N] \
        [--datasets kodak,xray] [--codecs jpeg,jpeg2000,...] [--crop 512] [--gray] [--refine-steps 100] \
        [--ladder visemz-mbt2018-mean-refine100=1,2,4,8]

Writes OUT/points.csv (every point; a rerun skips points already there), OUT/summary.md (BD tables
against JPEG, JPEG 2000, WebP and JPEG XL; lossless and near-lossless tables: bits per pixel at a
guaranteed maximum error E, in levels of the image's own dtype, against PNG, JPEG-LS, JPEG 2000
reversible, JPEG XL lossless and WebP lossless, with each point's measured maximum error checked),
CompressAI-style results files OUT/rd/<dataset>.json, OUT/lossless/<dataset>.json and
OUT/near-lossless/<dataset>.json, and the figures OUT/rd_<dataset>.png and OUT/crops_<dataset>.png.

``--crop N`` codes each image's central N x N pixels and ``--gray`` its luma (the dataset's name
says so: ``xray-gray-crop512``).  ``--refine-steps N`` adds codec visemz-<arch>-refine<N> (N steps of
encoder-side latent refinement, ``visemz/image/refine.py``) beside each visemz-<arch> of the selection, and
summary.md gives what the steps cost per image; a refined codec can also be named in ``--codecs``
directly, as can ``visemz-<arch>-maxerr-q<Q>`` (visemz's lossless and max_error ladder at model quality
Q).  ``--ladder CODEC=V1,V2,...`` (repeatable) replaces a codec's settings (qualities for the learned
codecs, maximum errors for the error-bounded ones).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from visemz.cuda import resolve
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
    ap.add_argument("--data", type=Path, required=True,
                    help="a folder of images, or of sub-folders of images (one dataset each)")
    ap.add_argument("--out", type=Path, default=Path("report"))
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--limit", type=int, default=None, help="first N images of each dataset")
    ap.add_argument("--datasets", default=None, help="comma-separated sub-folders of --data (default: all)")
    ap.add_argument("--codecs", default=None, help="comma-separated codec names (default: all usable on the device)")
    ap.add_argument("--crop", type=int, default=None, help="code each image's central N x N pixels")
    ap.add_argument("--gray", action="store_true", help="code each image's luma")
    ap.add_argument("--refine-steps", type=int, default=0,
                    help="also run visemz-<arch>-refine<N> beside each visemz-<arch> codec (default 0: none)")
    ap.add_argument("--ladder", action="append", default=[], metavar="CODEC=V1,V2,...",
                    help="replace a codec's settings, e.g. visemz-mbt2018-mean-refine100=1,2,4,8 (repeatable)")
    ap.add_argument("--no-crops", action="store_true", help="skip the matched-bpp crop figures")
    args = ap.parse_args(argv)
    split = lambda s: tuple(s.split(",")) if s else None  # noqa: E731
    cfg = EvalConfig(codecs=split(args.codecs), device=resolve(args.device), limit=args.limit,
                     datasets=split(args.datasets), crops=not args.no_crops, refine_steps=args.refine_steps,
                     ladders=tuple(parse_ladder(t) for t in args.ladder), crop=args.crop, gray=args.gray)
    t0 = time.perf_counter()
    result = evaluate(args.data, args.out, cfg, log=lambda m: print(m, flush=True))
    print(f"{result.computed} points computed, {result.skipped} skipped, {len(result.failures)} failed "
          f"in {time.perf_counter() - t0:.1f} s; report in {args.out}")


if __name__ == "__main__":
    main()
