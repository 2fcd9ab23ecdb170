"""Is a variable-rate model within 0.2 dB of a fixed-rate model of the same size trained as long?

    python scripts/train.py --data DATA --out runs/fixed --time-limit 1500 \
        --models mbt2018-mean-rgb mbt2018-mean-rgb@q2 mbt2018-mean-rgb@q6      # from scratch, one process
    python scripts/fixed_vs_variable.py --ckpt runs/fixed --images DATA/eval/kodak \
        --device cuda --out fixed_vs_variable.json [--limit N] [--offsets ...] [--allow-unequal]
    python scripts/fixed_vs_variable.py --rescore --out fixed_vs_variable.json    # re-score saved points

Reads the compact checkpoints of scripts/train.py in --ckpt: every fixed-rate one (NAME@qQ,
trained with every sample at quality Q) is compared with the variable-rate NAME beside it.
Each model runs through visemz's own codec with float32 kernels (the fp16 checkpoint's
parameters, as export_weights.py builds them; no int8 export): every image of --images is
compressed to a real file and decoded from it; bpp from the file's bytes, PSNR from the decode,
each averaged over the images.  The fixed-rate model is measured at its quality Q; the
variable-rate model at Q + each of --offsets (clipped to [1, 8]), and its PSNR at the fixed
model's mean bpp is interpolated on that mean curve: linearly in log(bpp) between the two
measured points that bracket it (none when the fixed model's bpp lies outside the measured
range: widen --offsets; the curve's nearer end then bounds the gap, PSNR rising with bpp: below
the lowest rate the gap is at least the fixed PSNR less the variable model's there).  The gap
is the fixed model's PSNR less that interpolated PSNR (positive: the variable-rate model loses
that many dB at the same rate); the issue's target is a gap of at most --target-db (0.2).

"Trained as long": the checkpoints' step counts (their metadata) must agree within
--step-tolerance (relative), else the script stops before measuring, unless --allow-unequal.
The JSON (written atomically after every model measured) records each checkpoint's steps and
training seconds, the device, the images, every measured point and the gaps.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import evalkit
import export_weights
from visemz.codec import ImageCodec
from visemz.device import resolve
from visemz.errors import InvalidArgumentError
from visemz.evaluation.report import device_name
from visemz.io.writers import write_atomic
from visemz.models import registry, training

INTERPOLATION = ("PSNR linear in log(bpp) between the two variable-rate points (mean bpp, mean PSNR over the "
                 "images) that bracket the fixed-rate model's mean bpp; no extrapolation")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, default=None, help="a folder of scripts/train.py's compact checkpoints")
    ap.add_argument("--images", type=Path, default=None, help="the images to measure on, e.g. DATA/eval/kodak")
    ap.add_argument("--limit", type=int, default=None, help="the first N images (sorted by name)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    ap.add_argument("--offsets", nargs="+", type=float, default=[-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0],
                    help="qualities of the variable-rate model around each fixed one, as offsets from it")
    ap.add_argument("--step-tolerance", type=float, default=0.01,
                    help="largest relative difference of the checkpoints' step counts")
    ap.add_argument("--allow-unequal", action="store_true", help="measure even when the step counts differ more")
    ap.add_argument("--target-db", type=float, default=0.2, help="the gap allowed")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    ap.add_argument("--rescore", action="store_true",
                    help="recompute the comparisons of the JSON at --out from its measured points (no measuring)")
    args = ap.parse_args(argv)
    if args.ckpt is None and not args.rescore:
        ap.error("--ckpt is required (unless --rescore)")
    if args.images is None and not args.rescore:
        ap.error("--images is required (unless --rescore)")
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit {args.limit}: expected at least 1")
    if not (0 <= args.step_tolerance < 1):
        ap.error(f"--step-tolerance {args.step_tolerance}: expected a fraction in [0, 1)")
    return args


# ------------------------------------------------------------------------------------ checkpoints
def find_pairs(folder: Path) -> list[tuple[str, str, float]]:
    """(variable-rate name, fixed-rate name, its quality) for every NAME@qQ checkpoint in ``folder``."""
    names = sorted(p.name[: -len(".safetensors")] for p in folder.glob("*.safetensors")
                   if not p.name.endswith(".full.safetensors"))
    pairs = []
    for name in names:
        try:
            parsed = training.parse_name(name)
        except InvalidArgumentError as e:
            raise SystemExit(f"{folder}: {e}") from None
        if parsed.quality is None:
            continue
        base = parsed.spec.name
        if base not in names:
            raise SystemExit(f"{folder}: fixed-rate {name} has no variable-rate {base}.safetensors beside it")
        pairs.append((base, name, parsed.quality))
    if not pairs:
        raise SystemExit(f"{folder}: no fixed-rate checkpoint (NAME@qQ.safetensors) among {names}")
    return sorted(pairs, key=lambda p: (p[0], p[2]))


def check_steps(steps: dict[str, int], tolerance: float, allow: bool) -> None:
    """Stop unless every checkpoint trained (almost) as many steps as the others."""
    lo, hi = min(steps.values()), max(steps.values())
    if hi - lo <= tolerance * hi:
        return
    listing = ", ".join(f"{n} {s}" for n, s in steps.items())
    if not allow:
        raise SystemExit(f"the checkpoints were not trained as long ({listing}; more than {tolerance:.1%} apart): "
                         "train them together in one train.py run, or pass --allow-unequal")
    print(f"warning: step counts differ more than {tolerance:.1%} ({listing}); measured anyway (--allow-unequal)")


def load_model(folder: Path, name: str):
    """(float32 model, its spec, its checkpoint's record: steps, seconds, note, qualities)."""
    tensors, meta = export_weights.read_checkpoint(folder / f"{name}.safetensors")
    spec = training.parse_name(name).spec
    record = {"steps": int(meta.get("step", 0)), "train_seconds": float(meta.get("train_seconds", 0.0)),
              "note": meta.get("note", ""), "qualities": meta.get("qualities", "")}
    return export_weights.build(name, spec, tensors), spec, record


# ------------------------------------------------------------------------------------ measurement
def variable_qualities(fixed: list[float], offsets: list[float]) -> list[float]:
    """Every fixed quality plus each offset, clipped to the ladder, sorted, without repeats."""
    clip = lambda q: min(max(q, registry.QUALITY_MIN), registry.QUALITY_MAX)  # noqa: E731
    return sorted({round(clip(q + o), 6) for q in fixed for o in offsets})


def psnr_at_bpp(points: list[dict], bpp: float) -> tuple[float | None, list[float] | None]:
    """(PSNR interpolated at ``bpp`` on the points' curve, the bracketing points' qualities); (None, None)
    when ``bpp`` lies outside the points' bpp range.  See INTERPOLATION."""
    curve = sorted(points, key=lambda p: p["bpp"])
    for a, b in zip(curve, curve[1:]):
        if a["bpp"] <= bpp <= b["bpp"]:
            if b["bpp"] == a["bpp"]:
                return a["psnr"], [a["quality"], b["quality"]]
            t = (math.log(bpp) - math.log(a["bpp"])) / (math.log(b["bpp"]) - math.log(a["bpp"]))
            return a["psnr"] + t * (b["psnr"] - a["psnr"]), [a["quality"], b["quality"]]
    if len(curve) == 1 and curve[0]["bpp"] == bpp:
        return curve[0]["psnr"], [curve[0]["quality"]] * 2
    return None, None


def measure_curve(codec, model, spec, images, qualities: list[float]) -> list[dict]:
    """[{quality, bpp, psnr}] of ``model`` through visemz's codec with float32 kernels."""
    with export_weights.float32_weights(model, spec):
        points = []
        for q in qualities:
            m = export_weights.measure_at(codec, spec, images, q, ms_ssim=False)
            points.append({"quality": q, "bpp": m["bpp"], "psnr": m["psnr"]})
            print(f"  {spec.name} q{q:g}: {m['bpp']:.4f} bpp, {m['psnr']:.3f} dB", flush=True)
    return points


def gap_bounds(fixed_point: dict, curve: list[dict]) -> tuple[float | None, float | None]:
    """(at least, at most) for a gap that cannot be interpolated, from the variable curve's end nearest the
    fixed model's rate, PSNR rising with bpp along the curve: a fixed rate below the curve's lowest gives a
    lower bound (the variable model there would do no better than at its lowest measured rate; at the
    ladder's bottom it cannot reach that rate at all), above its highest an upper bound."""
    low = min(curve, key=lambda p: p["bpp"])
    high = max(curve, key=lambda p: p["bpp"])
    if fixed_point["bpp"] < low["bpp"]:
        return fixed_point["psnr"] - low["psnr"], None
    if fixed_point["bpp"] > high["bpp"]:
        return None, fixed_point["psnr"] - high["psnr"]
    return None, None


def compare(variable: str, fixed: str, quality: float, fixed_point: dict, curve: list[dict], target: float) -> dict:
    psnr, bracket = psnr_at_bpp(curve, fixed_point["bpp"])
    gap = None if psnr is None else fixed_point["psnr"] - psnr
    at_least, at_most = gap_bounds(fixed_point, curve)  # (None, None) inside the curve, where gap is interpolated
    if gap is not None:
        within = gap <= target
    elif at_least is not None and at_least > target:
        within = False
    elif at_most is not None and at_most <= target:
        within = True
    else:
        within = None
    same_q = next((p for p in curve if p["quality"] == quality), None)
    return {"variable": variable, "fixed": fixed, "quality": quality,
            "fixed_bpp": fixed_point["bpp"], "fixed_psnr": fixed_point["psnr"],
            "variable_psnr_at_fixed_bpp": psnr, "bracket_qualities": bracket,
            "gap_db": gap, "gap_at_least_db": at_least, "gap_at_most_db": at_most, "within_target": within,
            "variable_at_same_quality": same_q,
            "why_no_gap": None if gap is not None else why_no_gap(fixed_point, curve)}


def why_no_gap(fixed_point: dict, curve: list[dict]) -> str:
    low, high = min(p["bpp"] for p in curve), max(p["bpp"] for p in curve)
    where = "below" if fixed_point["bpp"] < low else "above"
    lowest_quality = min(p["quality"] for p in curve) <= registry.QUALITY_MIN
    hint = ("the variable model has no lower rate (its quality 1 is the lowest)" if where == "below" and lowest_quality
            else "widen --offsets")
    return (f"the fixed model's {fixed_point['bpp']:.4f} bpp is {where} the variable model's measured range "
            f"[{low:.4f}, {high:.4f}]: {hint}")


def table(result: dict) -> str:
    ckpts = result["checkpoints"]
    lines = [f"on {result['device']}; {result['images']['count']} images of {result['images']['folder']}; "
             f"gap = fixed PSNR - variable PSNR at the fixed model's bpp (target <= {result['target_db']} dB)",
             f"{'fixed-rate model':26} {'q':>4} {'steps':>8} {'var steps':>9} {'bpp':>7} {'PSNR':>7} "
             f"{'var PSNR':>8} {'gap dB':>7}"]
    for c in result["comparisons"]:
        var_psnr = "-" if c["gap_db"] is None else f"{c['variable_psnr_at_fixed_bpp']:8.3f}"
        gap = f"{c['gap_db']:+7.3f}" if c["gap_db"] is not None else (
            f">={c['gap_at_least_db']:+.3f}" if c.get("gap_at_least_db") is not None else
            f"<={c['gap_at_most_db']:+.3f}" if c.get("gap_at_most_db") is not None else "n/a")
        lines.append(f"{c['fixed']:26} {c['quality']:4g} {ckpts[c['fixed']]['steps']:8d} "
                     f"{ckpts[c['variable']]['steps']:9d} {c['fixed_bpp']:7.4f} {c['fixed_psnr']:7.3f} "
                     f"{var_psnr:>8} {gap:>7}")
    return "\n".join(lines)


def rescore(path: Path) -> dict:
    """The comparisons of a written JSON recomputed from its measured points and its own target (after a
    change to how a gap is scored), written back atomically; the measuring options play no part."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--rescore {path}: cannot read it as JSON ({e})") from None
    missing = [k for k in ("fixed_points", "variable_curves", "target_db", "comparisons")
               if not isinstance(result, dict) or k not in result]
    if missing:
        raise SystemExit(f"--rescore {path}: not a JSON this script wrote (no {', '.join(missing)})")
    result["comparisons"] = [compare(c["variable"], c["fixed"], c["quality"], result["fixed_points"][c["fixed"]],
                                     result["variable_curves"][c["variable"]], result["target_db"])
                             for c in result["comparisons"]]
    write_atomic(path, (json.dumps(result, indent=1) + "\n").encode())
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.rescore:
        result = rescore(args.out)
        print(table(result))
        return result
    pairs = find_pairs(args.ckpt)
    names = list(dict.fromkeys([v for v, _, _ in pairs] + [f for _, f, _ in pairs]))
    loaded = {n: load_model(args.ckpt, n) for n in names}
    check_steps({n: loaded[n][2]["steps"] for n in names}, args.step_tolerance, args.allow_unequal)
    device = resolve(args.device)
    codec = ImageCodec(device)
    result = {"question": "a variable-rate model within target_db of a fixed-rate model of the same "
                          "size trained as long, at two qualities",
              "device": device_name(device), "weights": "float32 (the fp16 checkpoints' parameters)",
              "images": {"folder": str(args.images)}, "target_db": args.target_db, "offsets": args.offsets,
              "step_tolerance": args.step_tolerance, "allow_unequal": args.allow_unequal,
              "interpolation": INTERPOLATION, "gap": "fixed_psnr - variable_psnr_at_fixed_bpp (dB)",
              "checkpoints": {n: loaded[n][2] for n in names}, "variable_curves": {}, "fixed_points": {},
              "comparisons": []}
    images = {}
    for variable in dict.fromkeys(v for v, _, _ in pairs):
        model, spec, _ = loaded[variable]
        if spec.variant not in images:
            images[spec.variant] = evalkit.load_folder(args.images, spec.variant == "gray", args.limit)
            if not images[spec.variant]:
                raise SystemExit(f"no images under {args.images}")
        imgs = images[spec.variant]
        result["images"].update(count=len(imgs), names=[n for n, _ in imgs])
        mine = [(f, q) for v, f, q in pairs if v == variable]
        print(f"{variable}: {len(imgs)} images on {result['device']}", flush=True)
        curve = measure_curve(codec, model, spec, imgs, variable_qualities([q for _, q in mine], args.offsets))
        result["variable_curves"][variable] = curve
        for fixed, q in mine:
            fmodel, fspec, _ = loaded[fixed]
            point = measure_curve(codec, fmodel, fspec, imgs, [q])[0]
            result["fixed_points"][fixed] = point
            result["comparisons"].append(compare(variable, fixed, q, point, curve, args.target_db))
            write_atomic(args.out, (json.dumps(result, indent=1) + "\n").encode())
    print(table(result))
    print(f"interpolation: {INTERPOLATION}\nwritten: {args.out}")
    return result


if __name__ == "__main__":
    main()
