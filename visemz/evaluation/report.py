"""From the points CSV to the report: mean curves, BD tables, lossless and near-lossless tables, plots,
summary.md and CompressAI-style results files (``rd/``, ``lossless/``, ``near-lossless/<dataset>.json``)."""

from __future__ import annotations

import json
import platform
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .. import markdown
from ..io.writers import write_atomic
from . import bound_tables, plots
from .bjontegaard import BDError, bd_quality, bd_rate
from .codecs import parse_refined

ANCHORS = ("jpeg", "jpeg2000", "webp", "jpegxl")
MEAN_FIELDS = ("bpp", "psnr", "ssim", "ms_ssim", "gmsd", "encode_s", "decode_s")


def mean_curves(rows: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """{dataset: {codec: [one point per setting, sorted by bpp]}}: metrics averaged over the images.

    A setting enters a curve only when every image of its dataset that the codec coded has
    it, so a half-finished run never mixes image sets along one curve; an error-bounded codec's
    setting whose output broke its bound on any image is left out (``bound_tables.violations``
    reports it).
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    images: dict[tuple, set] = defaultdict(set)
    for r in rows:
        groups[(r["dataset"], r["codec"], r["setting"])].append(r)
        images[(r["dataset"], r["codec"])].add(r["image"])
    curves: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for (ds, codec, setting), rs in groups.items():
        if len(rs) != len(images[(ds, codec)]) or any(bound_tables.breaks_bound(r) for r in rs):
            continue
        point = {"setting": setting, "value": float(rs[0]["value"]), "kind": rs[0]["kind"], "images": len(rs),
                 "device": rs[0]["device"], "max_abs_error": max(float(r["max_abs_error"]) for r in rs)}
        point.update({f: float(np.mean([float(r[f]) for r in rs])) for f in MEAN_FIELDS})
        curves[ds][codec].append(point)
    for by_codec in curves.values():
        for pts in by_codec.values():
            pts.sort(key=lambda p: p["bpp"])
    return {ds: dict(c) for ds, c in curves.items()}


def frontier(pts: list[dict], metric: str) -> list[dict]:
    """The points (sorted by bpp) that beat every cheaper point on ``metric``: a point that
    costs more bits for no better quality is dominated and cannot be interpolated through.
    A lossless point (infinite PSNR) has no place on a curve."""
    out: list[dict] = []
    for p in (p for p in pts if np.isfinite(p[metric])):
        if not out or (p[metric] > out[-1][metric] and p["bpp"] > out[-1]["bpp"]):
            out.append(p)
    return out


def bd_cell(anchor: list[dict], test: list[dict], metric: str, what: str) -> str:
    """One table cell: BD-rate (%) or BD-quality of test against anchor, or why it has none."""
    fn = bd_rate if what == "rate" else bd_quality
    anchor, test = frontier(anchor, metric), frontier(test, metric)
    try:
        v = fn([p["bpp"] for p in anchor], [p[metric] for p in anchor], [p["bpp"] for p in test],
               [p[metric] for p in test])
    except BDError as e:
        reason = "no overlap" if "share no interval" in str(e) else \
            "not monotone" if "increase" in str(e) else "too few points"
        return f"n/a ({reason})"
    return f"{v:+.1f}%" if what == "rate" else f"{v:+.2f}"


def lossy_curves(curves: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The curves with at least two points of finite PSNR (not a lossless-only codec's single point)."""
    return {c: pts for c, pts in curves.items() if sum(np.isfinite(p["psnr"]) for p in pts) >= 2}


def bd_table(curves: dict[str, list[dict]]) -> list[str]:
    curves = lossy_curves(curves)
    anchors = [a for a in ANCHORS if a in curves]
    if not anchors:
        return ["(no JPEG, JPEG 2000, WebP or JPEG XL curve to compare against)"]
    head = ["codec"] + [f"BD-rate vs {a} (PSNR)" for a in anchors] + [f"BD-rate vs {anchors[0]} (MS-SSIM)",
                                                                      f"BD-PSNR vs {anchors[0]} (dB)"]
    first = curves[anchors[0]]

    def row(codec: str, pts: list[dict]) -> list[str]:
        vs = [bd_cell(curves[a], pts, "psnr", "rate") if a != codec else "0 (anchor)" for a in anchors]
        return [codec, *vs, bd_cell(first, pts, "ms_ssim", "rate"), bd_cell(first, pts, "psnr", "quality")]

    return markdown.table(head, [row(codec, pts) for codec, pts in curves.items()])


def points_table(curves: dict[str, list[dict]]) -> list[str]:
    head = ["codec", "setting", "bpp", "PSNR dB", "SSIM", "MS-SSIM", "GMSD", "max err", "enc ms", "dec ms", "device"]
    return markdown.table(head, ([codec, p["setting"], f"{p['bpp']:.4f}", f"{p['psnr']:.2f}", f"{p['ssim']:.4f}",
                                  f"{p['ms_ssim']:.4f}", f"{p['gmsd']:.4f}", f"{p['max_abs_error']:g}",
                                  f"{1e3 * p['encode_s']:.1f}", f"{1e3 * p['decode_s']:.1f}", p["device"]]
                                 for codec, pts in curves.items() for p in pts))


def refine_costs(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """{dataset: {visemz-<arch>-refine<N>: its encode cost}}: over the (image, setting) points that
    visemz-<arch> also has on the same device (column ``device``), the mean encode seconds of both and
    the mean extra seconds per image scaled to 100 steps: what refinement adds to an encode.  Without
    such points, over all the refined points, the whole encode scaled to 100 steps: an upper bound."""
    by_key = {(r["dataset"], r["codec"], r["image"], r["setting"]): r for r in rows}
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for ds, codec in dict.fromkeys((r["dataset"], r["codec"]) for r in rows):
        refined = parse_refined(codec)
        if refined is None:
            continue
        arch, steps = refined
        mine = [r for r in rows if r["dataset"] == ds and r["codec"] == codec]
        pairs = []  # (refined, unrefined) encode seconds of one image at one setting
        for r in mine:
            b = by_key.get((ds, f"visemz-{arch}", r["image"], r["setting"]))
            if b is not None and b["device"] == r["device"]:
                pairs.append((float(r["encode_s"]), float(b["encode_s"])))
        if pairs:
            encode_s, base = (float(np.mean(v)) for v in zip(*pairs))
        else:
            encode_s, base = float(np.mean([float(r["encode_s"]) for r in mine])), None
        out[ds][codec] = {"steps": steps, "points": len(pairs) or len(mine),
                          "devices": sorted({r["device"] for r in mine}), "encode_s": encode_s,
                          "unrefined_encode_s": base, "s_per_100_steps": (encode_s - (base or 0)) * 100 / steps,
                          "upper_bound": not pairs}
    return dict(out)


def refine_cost_table(costs: dict[str, dict], device: str) -> list[str]:
    """The encode cost of each refined codec of one dataset, its device named as far as the CSV tells."""
    if not costs:
        return []
    lines = ["Encode cost of refinement: extra seconds per image for 100 steps, over the points the unrefined "
             "codec also has on the same device (the whole encode over all points, an upper bound, where it has "
             "none).", ""]
    head = ["codec", "steps", "points", "encode s", "unrefined encode s", "s per image per 100 steps", "device"]
    rows = []
    for codec, c in costs.items():
        base = "-" if c["unrefined_encode_s"] is None else f"{c['unrefined_encode_s']:.3f}"
        per100 = f"{c['s_per_100_steps']:.3f}" + (" (upper bound)" if c["upper_bound"] else "")
        rows.append([codec, c["steps"], c["points"], f"{c['encode_s']:.3f}", base, per100, _where(c, device)])
    return lines + markdown.table(head, rows)


def _where(cost: dict, device: str) -> str:
    """The refined points' device: this run's by name when they all came from its kind, else the CSV's column."""
    return device_name(device) if cost["devices"] == [device] else ", ".join(cost["devices"])


def summary_markdown(curves: dict, failures: list[str], device_name: str, refine: dict | None = None,
                     device: str = "cpu", rows: list[dict] = (), figures: dict[str, list[str]] | None = None) -> str:
    """The report; ``rows`` (the points CSV) give the lossless and near-lossless tables and the broken bounds,
    ``figures`` the names of each dataset's figures."""
    out = ["# Rate-distortion evaluation", "",
           f"Device: {device_name}. bpp = output bytes x 8 / pixels; PSNR against the bit depth's range; "
           "metrics are means over each dataset's images. BD: Bjontegaard deltas with PCHIP interpolation "
           "over the shared quality interval (negative BD-rate = fewer bits than the anchor), on each curve's "
           "non-dominated points (a point with more bits and no better quality is left out). Maximum errors E "
           "count levels of the image's own dtype.", ""]
    bounds = bound_tables.bound_points(list(rows))
    for ds in dict.fromkeys([*curves, *bounds]):
        by_codec = curves.get(ds, {})
        out += [f"## {ds}", "", *bd_table(by_codec), ""]
        rc = refine_cost_table((refine or {}).get(ds, {}), device)
        if rc:
            out += [*rc, ""]
        colour = any(int(r["channels"]) > 1 for r in rows if r["dataset"] == ds)
        out += bound_tables.section(ds, bounds.get(ds, {}), colour)
        if (figures or {}).get(ds):
            out += [f"Plots: {', '.join(figures[ds])}.", ""]
        out += ["<details><summary>every mean point</summary>", "",
                *points_table(by_codec), "", "</details>", ""]
    broken = bound_tables.violations(list(rows))
    if broken:
        out += ["## Broken bounds", "", "Points whose measured maximum error is above their codec's bound "
                "(left out of every mean, ratio and curve):", "", *[f"- {b}" for b in broken], ""]
    if failures:
        out += ["## Failures", "", *[f"- {f}" for f in failures], ""]
    return "\n".join(out)


def devices_line(rows: list[dict], device: str) -> str:
    """This run's device, and the devices of points a resumed CSV already held (per-point column 'device')."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["device"]] = counts.get(r["device"], 0) + 1
    if set(counts) <= {"cpu", device}:
        return device_name(device)
    held = ", ".join(f"{d}: {n} points" for d, n in sorted(counts.items()))
    return f"{device_name(device)} for this run; the CSV's points came from several devices ({held})"


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()})"


def rd_json(dataset: str, curves: dict[str, list[dict]]) -> dict:
    """CompressAI-style results of one dataset's lossy curves: per codec, lists aligned on its settings."""
    fields = {"bpp": "bpp", "psnr": "psnr", "ssim": "ssim", "ms_ssim": "ms-ssim", "gmsd": "gmsd",
              "max_abs_error": "max_error", "encode_s": "encoding_time", "decode_s": "decoding_time"}
    codecs = {}
    for codec, pts in lossy_curves(curves).items():
        pts = [p for p in pts if np.isfinite(p["psnr"])]
        results = {"setting": [p["setting"] for p in pts], **{v: [p[k] for p in pts] for k, v in fields.items()}}
        codecs[codec] = {"name": codec, "device": pts[0]["device"], "results": results}
    return {"name": dataset, "description": "rate-distortion: means over the dataset's images; times in seconds per "
            "image", "codecs": codecs}


def write_results(out: Path, rows: list[dict], curves: dict) -> None:
    """OUT/rd/<dataset>.json, OUT/lossless/<dataset>.json and OUT/near-lossless/<dataset>.json."""
    def write(path: Path, doc: dict) -> None:
        write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())

    for ds, by_codec in curves.items():
        if lossy_curves(by_codec):
            write(out / "rd" / f"{ds}.json", rd_json(ds, by_codec))
    for ds, points in bound_tables.bound_points(rows).items():
        for lossless, folder in ((True, "lossless"), (False, "near-lossless")):
            doc = bound_tables.results_json(ds, points, lossless)
            if doc["codecs"] or doc["broken"]:
                write(out / folder / f"{ds}.json", doc)


def write_report(folder: Path, out: Path, cfg, rows: list[dict], failures: list[str],
                 log: Callable[[str], None] = print) -> None:
    curves = mean_curves(rows)
    figures: dict[str, list[str]] = defaultdict(list)
    for ds, by_codec in curves.items():
        if not lossy_curves(by_codec):
            continue  # lossless points only: nothing to plot
        plots.rd_plot(ds, lossy_curves(by_codec), out / f"rd_{ds}.png")
        figures[ds].append(f"rd_{ds}.png")
        if cfg.crops and plots.crop_figure(folder, ds, rows, cfg, out / f"crops_{ds}.png"):
            figures[ds].append(f"crops_{ds}.png")
    refine = refine_costs(rows)
    for ds, costs in refine.items():
        for codec, c in costs.items():
            log(f"{ds} {codec}: {c['s_per_100_steps']:.3f} s per image per 100 steps"
                f"{' (upper bound)' if c['upper_bound'] else ''} on {_where(c, cfg.device)} ({c['points']} points)")
    write_results(out, rows, curves)
    write_atomic(out / "summary.md",
                 summary_markdown(curves, failures, devices_line(rows, cfg.device), refine, cfg.device, rows,
                                  figures).encode())
    log(f"report: {out / 'summary.md'}")
