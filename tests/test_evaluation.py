"""Rate-distortion evaluation: metrics, Bjontegaard deltas, every codec's ladder, resumable runs, the CLI."""

from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np
import pytest

import visemz
from visemz.errors import DeviceUnavailableError, InvalidArgumentError, UnsupportedFormatError
from visemz.evaluation import bjontegaard as bd
from visemz.evaluation import metrics, report
from visemz.evaluation.codecs import NAMES, Layout, build, default_names, parse_refined, with_refined
from visemz.evaluation.report import mean_curves, summary_markdown
from visemz.evaluation.runner import EvalConfig, parse_ladder, read_points, run_points, write_points

pytestmark = pytest.mark.usefixtures("eval_extra")


def tiny(channels: int, seed: int = 0, side: int = 64) -> np.ndarray:
    """A smooth gradient with texture on top: compressible, but not trivially."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side]
    base = 96 + 60 * np.sin(x / 7.0) * np.cos(y / 11.0) + rng.normal(0, 12, (side, side))
    planes = [np.clip(base + 20 * c, 0, 255) for c in range(channels)]
    img = np.stack(planes, -1) if channels == 3 else planes[0]
    return np.round(img).astype(np.uint8)


# ------------------------------------------------------------------ metrics
@pytest.mark.parametrize("channels", [1, 3])
def test_structural_metrics_rank_damage(channels):
    ref = tiny(channels)
    rng = np.random.default_rng(1)
    mild = np.clip(ref.astype(int) + rng.integers(-3, 4, ref.shape), 0, 255).astype(np.uint8)
    bad = np.clip(ref.astype(int) + rng.integers(-40, 41, ref.shape), 0, 255).astype(np.uint8)
    same, m1, m2 = (metrics.measure(ref, r, 10) for r in (ref, mild, bad))
    assert same["ssim"] == pytest.approx(1.0, abs=1e-6) and same["ms_ssim"] == pytest.approx(1.0, abs=1e-6)
    assert same["gmsd"] == pytest.approx(0.0, abs=1e-6)
    assert same["ssim"] > m1["ssim"] > m2["ssim"]
    assert same["ms_ssim"] > m1["ms_ssim"] > m2["ms_ssim"]
    assert m2["gmsd"] > m1["gmsd"] > same["gmsd"]


def test_metrics_reject_mismatched_and_unsupported_images():
    with pytest.raises(InvalidArgumentError, match=r"\(64, 64\)"):
        metrics.measure(tiny(1), tiny(3), 10)
    with pytest.raises(UnsupportedFormatError, match="float32"):
        metrics.check_dtype(np.float32)


# ------------------------------------------------------------------ Bjontegaard
RATES = [0.1, 0.25, 0.5, 1.0, 2.0]
PSNRS = [26.0, 29.0, 31.5, 34.0, 37.0]


def test_bd_of_identical_curves_is_zero():
    assert bd.bd_rate(RATES, PSNRS, RATES, PSNRS) == pytest.approx(0.0, abs=1e-9)
    assert bd.bd_psnr(RATES, PSNRS, RATES, PSNRS) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("factor, expected", [(0.8, -20.0), (1.5, 50.0), (0.5, -50.0)])
def test_bd_rate_of_a_scaled_rate_is_the_scale(factor, expected):
    assert bd.bd_rate(RATES, PSNRS, [r * factor for r in RATES], PSNRS) == pytest.approx(expected, abs=1e-9)


def test_bd_psnr_of_a_shifted_curve_is_the_shift():
    assert bd.bd_psnr(RATES, PSNRS, RATES, [p + 1 for p in PSNRS]) == pytest.approx(1.0, abs=1e-9)
    # point order does not matter, and a different sampling of the same line agrees
    assert bd.bd_psnr(RATES[::-1], PSNRS[::-1], RATES, [p - 0.5 for p in PSNRS]) == pytest.approx(-0.5, abs=1e-9)


def test_bd_uses_pchip_not_a_polynomial():
    # a kinked curve: PCHIP follows it exactly between points, so a sub-sampled copy of a
    # piecewise-linear-in-log curve still gives the interpolated value, not a cubic fit's
    lr = np.log10(RATES)
    test_q = np.interp(lr, lr, PSNRS) + 2
    assert bd.bd_psnr(RATES, PSNRS, RATES, test_q) == pytest.approx(2.0, abs=1e-9)


@pytest.mark.parametrize("rate, quality, match", [
    ([0.1], [30.0], "at least 2"),
    ([0.1, 0.2, 0.4], [30.0, 29.0, 31.0], "increase"),
    ([0.1, -0.2], [30.0, 31.0], "rate <= 0"),
])
def test_bd_rejects_unusable_curves(rate, quality, match):
    with pytest.raises(bd.BDError, match=match):
        bd.bd_rate(RATES, PSNRS, rate, quality)


def test_bd_rejects_curves_without_overlap():
    with pytest.raises(bd.BDError, match="share no interval"):
        bd.bd_rate(RATES, PSNRS, RATES, [p + 20 for p in PSNRS])


# ------------------------------------------------------------------ codecs
CPU_CODECS = [n for n in NAMES if n != "nvjpeg"]


def _check_ladder(codec, image):
    layout = Layout.of(image)
    assert codec.supports(layout) is None
    for s in codec.ladder:
        data = codec.encode(image, s)
        assert isinstance(data, bytes) and 0 < len(data)
        rec = codec.decode(data, s, layout)
        assert rec.shape == image.shape and rec.dtype == image.dtype
        m = metrics.measure(image, rec, len(data))
        assert m["psnr"] > 10, (codec.name, s, m)
        if codec.kind == "bound":
            assert m["max_abs_error"] <= s, (codec.name, s, m)


@pytest.mark.parametrize("name", CPU_CODECS)
def test_every_codec_decodes_every_ladder_point(name, model_weights):
    codec = build(name, "cpu")
    for channels in (1, 3):
        _check_ladder(codec, tiny(channels, seed=channels))


@pytest.mark.gpu
@pytest.mark.nvjpeg
def test_nvjpeg_decodes_every_ladder_point():
    codec = build("nvjpeg", "cuda")
    for channels in (1, 3):
        _check_ladder(codec, tiny(channels, seed=channels))


def test_codec_registry_rejects_bad_names_and_devices():
    with pytest.raises(InvalidArgumentError, match="'jpg'"):
        build("jpg", "cpu")
    with pytest.raises(DeviceUnavailableError, match="nvjpeg"):
        build("nvjpeg", "cpu")
    assert "nvjpeg" not in default_names("cpu") and "nvjpeg" in default_names("cuda")


def test_refined_codec_names():
    codec = build("visemz-balle2016-refine3", "cpu")
    assert (codec.name, codec.refine, codec.arch) == ("visemz-balle2016-refine3", 3, "balle2016")
    assert parse_refined("visemz-mbt2018-mean-refine100") == ("mbt2018-mean", 100)
    assert parse_refined("visemz-mbt2018-mean") is None and parse_refined("jpeg") is None
    for bad in ("visemz-balle2016-refine0", "visemz-balle2016-refine10001", "visemz-balle2016-refine02",
                "visemz-other-refine5", "visemz-balle2016-maxerr-refine5"):
        with pytest.raises(InvalidArgumentError, match=bad):
            build(bad, "cpu")
    names = ("jpeg", "visemz-mbt2018-mean", "visemz-balle2016-maxerr")
    assert with_refined(names, 0) == names
    assert with_refined(names, 7) == (*names, "visemz-mbt2018-mean-refine7")
    assert EvalConfig(codecs=("webp", "visemz-balle2016"), refine_steps=4).codec_names() == (
        "webp", "visemz-balle2016", "visemz-balle2016-refine4")
    with pytest.raises(InvalidArgumentError, match="-1"):
        EvalConfig(refine_steps=-1)


def test_rate_codecs_spend_more_bits_for_higher_settings():
    img = tiny(3)
    for name in ("jpeg", "webp", "jpeg2000"):
        c = build(name, "cpu")
        sizes = [len(c.encode(img, s)) for s in (c.ladder[1], c.ladder[-1])]
        assert sizes[0] < sizes[1], name


# ------------------------------------------------------------------ runs
@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "sets"
    (root / "rgb").mkdir(parents=True)
    (root / "gray").mkdir()
    cv2.imwrite(str(root / "rgb/a.png"), cv2.cvtColor(tiny(3, 1), cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(root / "rgb/b.png"), cv2.cvtColor(tiny(3, 2), cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(root / "gray/c.png"), tiny(1, 3))
    (root / "gray/z_broken.png").write_bytes(b"not a png")
    return root


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_run_is_resumable(folder, tmp_path):
    cfg = EvalConfig(codecs=("jpeg", "sz3"), ladders=(("jpeg", (10, 50, 90)), ("sz3", (2, 8))))
    first = run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    assert first.computed == 3 * (3 + 2) and first.skipped == 0
    assert len(first.failures) == 1 and "broken.png" in first.failures[0]
    before = (tmp_path / "out/points.csv").read_bytes()
    second = run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    assert second.computed == 0 and second.skipped == 15
    assert (tmp_path / "out/points.csv").read_bytes() == before
    # a lost row is recomputed, and only it
    rows = _rows(tmp_path / "out/points.csv")
    write_points(tmp_path / "out/points.csv", rows[1:])
    third = run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    assert third.computed == 1 and third.skipped == 14


def test_points_of_a_changed_codec_are_computed_again(folder, tmp_path):
    cfg = EvalConfig(codecs=("jpeg", "sz3"), ladders=(("jpeg", (10, 50)), ("sz3", (2,))))
    path = tmp_path / "out/points.csv"
    run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    rows = _rows(path)
    now = f"cv2 {cv2.__version__}"
    assert {r["codec_id"] for r in rows if r["codec"] == "jpeg"} == {now}
    for r in rows:  # the JPEG points as another OpenCV left them (their sizes marked, to see them replaced)
        if r["codec"] == "jpeg":
            r["codec_id"], r["bytes"] = "cv2 0.0.0", "1"
    write_points(path, rows)
    logs = []
    again = run_points(folder, tmp_path / "out", cfg, log=logs.append)
    assert again.computed == again.recomputed == 3 * 2 and again.skipped == 3
    new = _rows(path)
    assert len(new) == len(rows)
    assert all(r["codec_id"] == now and r["bytes"] != "1" for r in new if r["codec"] == "jpeg")
    assert sum("computed by another version of the codec" in m for m in logs) == 3


def test_a_csv_without_identities_resumes_as_it_is(folder, tmp_path):
    cfg = EvalConfig(codecs=("jpeg",), ladders=(("jpeg", (10, 50)),))
    path = tmp_path / "out/points.csv"
    run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    rows = _rows(path)
    with open(path, "w", newline="") as f:  # the columns of an evaluation CSV before identities were recorded
        w = csv.DictWriter(f, fieldnames=[c for c in rows[0] if c != "codec_id"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    again = run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    assert again.computed == 0 and again.skipped == 3 * 2
    assert [r["codec_id"] for r in read_points(path)] == [""] * 6


def test_codec_identities_name_libraries_and_weights(model_weights):
    from visemz.models import residual_weights
    from visemz.models.weights import file_id

    gray, rgb = Layout((8, 8), "uint8"), Layout((8, 8, 3), "uint8")
    assert build("jpeg", "cpu").identity(gray) == f"cv2 {cv2.__version__}"
    bounded = build("visemz-mbt2018-mean-maxerr", "cpu")
    for layout, variant in ((gray, "gray"), (rgb, "rgb")):
        weights = file_id(model_weights / f"mbt2018-mean-{variant}.safetensors")
        prior = file_id(residual_weights.path_of(variant))
        assert bounded.identity(layout) == f"visemz {visemz.__version__}; weights {weights}; residual prior {prior}"
    assert build("visemz-mbt2018-mean", "cpu").identity(gray).startswith(f"visemz {visemz.__version__}")


def test_refined_rows_join_a_finished_run(folder, tmp_path, model_weights):
    """--refine-steps on a finished run computes only the refined codec's points (same loop, same
    measurement); the report puts it in the BD tables and states what its steps cost per image."""
    ladders = (("visemz-balle2016", (2, 6)), ("jpeg", (30, 90)))
    cfg = EvalConfig(codecs=("jpeg", "visemz-balle2016"), ladders=ladders)
    first = run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    assert first.computed == 3 * 4
    before = (tmp_path / "out/points.csv").read_text()
    cfg = EvalConfig(codecs=("jpeg", "visemz-balle2016"), refine_steps=2,
                     ladders=(*ladders, ("visemz-balle2016-refine2", (2, 6))))
    second = run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    assert second.computed == 3 * 2 and second.skipped == 3 * 4
    after = (tmp_path / "out/points.csv").read_text()
    assert after.startswith(before)  # the rows already there are left as they were
    rows = read_points(tmp_path / "out/points.csv")
    refined = [r for r in rows if r["codec"] == "visemz-balle2016-refine2"]
    assert {(r["dataset"], r["image"], r["setting"]) for r in refined} == {
        (d, i, q) for d, i in (("rgb", "a.png"), ("rgb", "b.png"), ("gray", "c.png")) for q in ("q=2", "q=6")}
    assert all(float(r["bpp"]) > 0 and float(r["encode_s"]) > 0 for r in refined)
    costs = report.refine_costs(rows)
    c = costs["rgb"]["visemz-balle2016-refine2"]
    assert (c["steps"], c["points"], c["upper_bound"], c["devices"]) == (2, 4, False, ["cpu"])
    extra = np.mean([float(r["encode_s"]) - float(b["encode_s"]) for r in refined if r["dataset"] == "rgb"
                     for b in rows if b["codec"] == "visemz-balle2016"
                     and (b["image"], b["setting"]) == (r["image"], r["setting"])])
    assert c["s_per_100_steps"] == pytest.approx(extra * 50)
    md = summary_markdown(mean_curves(rows), [], "test", costs, "cpu")
    assert md.count("| visemz-balle2016-refine2 | 2 | 4 |") == 1 and "| visemz-balle2016-refine2 | 2 | 2 |" in md
    assert "| visemz-balle2016-refine2 | +" in md or "| visemz-balle2016-refine2 | -" in md  # a BD-rate vs JPEG
    # refined points alone (no unrefined ones on their device): the whole encode, flagged as an upper bound
    alone = report.refine_costs([dict(r, device="cuda") if r["codec"] == "visemz-balle2016-refine2" else r
                                 for r in rows])
    assert alone["gray"]["visemz-balle2016-refine2"]["upper_bound"] is True


def test_cli_eval_with_refinement_and_ladders(folder, tmp_path, cli):
    """visemz eval --refine-steps with --ladder and --datasets: the refined rows in points.csv and summary.md,
    their cost logged; a bad --ladder is a usage error naming it."""
    out = tmp_path / "report"
    r = cli("eval", folder, "--out", out, "--device", "cpu", "--datasets", "gray",
            "--codecs", "jpeg,visemz-mbt2018-mean", "--refine-steps", "2", "--no-crops",
            "--ladder", "jpeg=40,90", "--ladder", "visemz-mbt2018-mean=1,4.5",
            "--ladder", "visemz-mbt2018-mean-refine2=1,4.5")
    assert r.exit_code == 1 and "broken.png" in r.stderr  # the broken file fails, the rest goes on
    rows = read_points(out / "points.csv")
    assert sorted((r["codec"], r["setting"]) for r in rows) == [
        ("jpeg", "q=40"), ("jpeg", "q=90"), ("visemz-mbt2018-mean", "q=1"), ("visemz-mbt2018-mean", "q=4.5"),
        ("visemz-mbt2018-mean-refine2", "q=1"), ("visemz-mbt2018-mean-refine2", "q=4.5")]
    assert "gray visemz-mbt2018-mean-refine2: " in r.stderr
    assert "| visemz-mbt2018-mean-refine2 | 2 | 2 |" in (out / "summary.md").read_text()
    for out, said in ((folder, "lies in the images' folder"), (folder / "gray/report", "lies in the images' folder"),
                      (folder / "gray/c.png", "is a file")):  # refused before any point runs
        r = cli("eval", folder, "--out", out, "--device", "cpu", "--codecs", "jpeg")
        assert r.exit_code == 2 and said in r.stderr and not (folder / "points.csv").exists(), r.stderr
    assert sorted(p.name for p in (folder / "gray").iterdir()) == ["c.png", "z_broken.png"]
    bad = cli("eval", folder, "--out", tmp_path / "o", "--device", "cpu", "--ladder", "jpeg=4,x")
    assert bad.exit_code == 2 and "'jpeg=4,x'" in bad.stderr
    for ladder, said in (("visemz-mbt2018-mean-maxerr=1,-3", "-3 is not a setting"), ("jpeg=101", "101 is not"),
                         ("visemz-mbt2018-mean=9", "quality=9"), ("visemz-mbt2018-mean-maxerr=1.5", "1.5 is not")):
        bad = cli("eval", folder, "--out", tmp_path / "o", "--device", "cpu", "--codecs", ladder.split("=")[0],
                  "--ladder", ladder)  # refused before any point
        assert bad.exit_code == 2 and said in bad.stderr and not (tmp_path / "o" / "points.csv").exists(), bad.stderr
    assert parse_ladder("webp=5,50") == ("webp", (5, 50)) and parse_ladder("jpeg=1.5") == ("jpeg", (1.5,))
    for text in ("webp", "webp=", "=5", "webp=5,x"):
        with pytest.raises(InvalidArgumentError, match=repr(text)):
            parse_ladder(text)


def test_codecs_leave_images_the_metrics_cannot_score():
    """Four channels (RGBA) are neither gray nor RGB: every codec says so before a point runs, the error-bounded
    ones too (they would code them, and the metrics then fail at each point)."""
    from visemz.evaluation.codecs import scientific

    rgba = Layout((8, 8, 4), "uint8")
    for name in ("visemz-mbt2018-mean", "visemz-mbt2018-mean-maxerr", "jpeg", *sorted(scientific.installed())):
        assert "gray or RGB" in build(name, "cpu").supports(rgba), name


def test_report_tables(folder, tmp_path):
    cfg = EvalConfig(codecs=("jpeg", "webp", "sz3"), datasets=("rgb",))
    res = run_points(folder, tmp_path / "out", cfg, log=lambda m: None)
    rows = read_points(res.csv)
    curves = mean_curves(rows)
    assert set(curves) == {"rgb"} and set(curves["rgb"]) == {"jpeg", "webp", "sz3"}
    assert all(p["images"] == 2 for p in curves["rgb"]["jpeg"])
    md = summary_markdown(curves, [], "test", rows=rows)
    assert "| jpeg | 0 (anchor) |" in md and "| sz3 |" in md and "max error seen" in md
    assert "| 1 | sz3 | 2 |" in md and "| 32 | sz3 | 2 |" in md  # the near-lossless table, E in the images' levels


def test_cli_eval_writes_csv_plots_and_summary(folder, tmp_path, cli):
    out = tmp_path / "report"
    args = ["eval", folder, "--codecs", "jpeg,webp,visemz-balle2016", "--out", out, "--device", "cpu", "--limit", "2"]
    r = cli(*args)
    assert r.exit_code == 1, r.stderr  # broken.png is reported, the rest goes on
    assert "broken.png" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["crops_gray.png", "crops_rgb.png", "points.csv", "rd",
                                                     "rd_gray.png", "rd_rgb.png", "summary.md"]
    assert sorted(p.name for p in (out / "rd").iterdir()) == ["gray.json", "rgb.json"]
    rows = _rows(out / "points.csv")
    assert len(rows) == 3 * (8 + 8 + 8)
    assert {r["codec"] for r in rows} == {"jpeg", "webp", "visemz-balle2016"}
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert "## rgb" in summary and "## gray" in summary and "visemz-balle2016" in summary
    again = cli(*args, "--no-crops")
    assert "0 points computed, 72 already" in again.stdout


def test_cli_eval_rejects_bad_arguments(folder, tmp_path, cli):
    def run(*args):
        return cli("eval", *args, "--device", "cpu", "--out", tmp_path / "o")

    r = run(tmp_path / "missing")
    assert r.exit_code == 2 and "missing" in r.stderr
    r = run(folder, "--codecs", "jpg")
    assert r.exit_code == 2 and "'jpg'" in r.stderr
    r = run(folder, "--datasets", "kodak")
    assert r.exit_code == 2 and "kodak" in r.stderr
    r = run(folder, "--refine-steps", "-3")
    assert r.exit_code == 2 and "refine=-3" in r.stderr
    assert not (tmp_path / "o" / "points.csv").exists()


def test_summary_names_the_devices_of_a_resumed_csv():
    line = report.devices_line([{"device": "cpu"}, {"device": "cuda"}, {"device": "cuda"}], "cpu")
    assert "cuda: 2 points" in line and "cpu: 1 points" in line
    assert report.devices_line([{"device": "cpu"}], "cpu") == report.device_name("cpu")
