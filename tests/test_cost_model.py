"""The cost model (visemz.collectives.cost) on synthetic timings, and tools/cost_model.py's table."""

import json

import pytest
import torch

from visemz import config, defaults
from visemz.collectives import autotune
from visemz.collectives.cost import ALGORITHMS, CostModel, Line, exchanges, fit_corrections, messages, wire_factor
from visemz.errors import InvalidArgumentError

from .helpers import load_tool

cm = load_tool("cost_model")

MIB = 1 << 20
SIZES = (1 * MIB, 32 * MIB)


def timings(link_Bps: float, codec_Bps: float, ratio: float, world: int = 2, latency=(50e-6, 1e-3, 0.6e-3)) -> dict:
    """Synthetic calibration table: what each algorithm would take at SIZES on such a group."""
    link = 1 / link_Bps
    out = {}
    for a, lat in zip(ALGORITHMS, latency):
        per_byte = wire_factor(a, world) * link / (1 if a == "plain" else ratio) + \
            (0 if a == "plain" else 1 / codec_Bps)
        out[a] = tuple(lat + n * per_byte for n in SIZES)
    return out


def test_wire_factors_and_messages():
    assert wire_factor("plain", 2) == wire_factor("ring", 2) == wire_factor("recursive_doubling", 2) == 1
    assert wire_factor("ring", 8) == pytest.approx(2 * 7 / 8)
    assert wire_factor("recursive_doubling", 8) == 3
    assert wire_factor("recursive_doubling", 6) == 2 + 2  # log2 4, plus fold-in and hand-back
    assert messages("plain", 4) == 6 and messages("ring", 4) == 12 and messages("recursive_doubling", 3) == 2 * 3
    assert exchanges("ring", 4) == 6
    assert exchanges("recursive_doubling", 8) == 3 and exchanges("recursive_doubling", 6) == 4
    with pytest.raises(InvalidArgumentError, match="plain"):
        exchanges("plain", 4)
    with pytest.raises(InvalidArgumentError, match="tree"):
        wire_factor("tree", 4)


def test_line_through_two_points_never_goes_negative():
    line = Line.through(1, 3.0, 3, 7.0)
    assert (line.intercept, line.slope) == (1.0, 2.0)
    assert Line.through(1, 5.0, 3, 4.0).slope == 0  # timing noise: a shrinking time is a flat line
    assert Line.through(1, 1.0, 3, 10.0).intercept == 0
    with pytest.raises(InvalidArgumentError):
        Line.through(3, 1.0, 1, 2.0)


def test_fit_recovers_the_parameters_it_was_built_from():
    m = CostModel.from_timings(2, SIZES, timings(3e9, 100e9, 5.0), 5.0)
    assert m.link == pytest.approx(1 / 3e9)
    assert m.costs["ring"].codec == pytest.approx(1 / 100e9)
    assert m.costs["plain"].latency == pytest.approx(50e-6)
    n = 256 * MIB
    assert m.seconds("recursive_doubling", n) == pytest.approx(0.6e-3 + n * (1 / 100e9 + 1 / 3e9 / 5))
    # another ratio rescales the wire part only
    assert m.seconds("ring", n, 2.5) - m.seconds("ring", n) == pytest.approx(n / 3e9 * (1 / 2.5 - 1 / 5))


def test_slow_link_chooses_compression_fast_link_plain():
    sockets = CostModel.from_timings(2, SIZES, timings(3e9, 100e9, 5.0), 5.0)  # TCP over loopback
    assert sockets.choose(256 * MIB) == "recursive_doubling"  # lower latency than the ring at W = 2
    assert sockets.choose(4096) == "plain"  # small tensors: latency decides
    nvlink = CostModel.from_timings(2, SIZES, timings(250e9, 100e9, 5.0), 5.0)
    assert all(nvlink.choose(n) == "plain" for n in (4096, MIB, 256 * MIB, 4096 * MIB))


def test_observed_ratio_changes_the_choice():
    m = CostModel.from_timings(2, SIZES, timings(3e9, 20e9, 3.0), 3.0)
    n = 256 * MIB
    assert m.choose(n) != "plain" and m.choose(n, ratio=1.05) == "plain"  # data that hardly compresses


def test_more_ranks_favour_the_ring_for_large_tensors():
    m = CostModel.from_timings(8, SIZES, timings(3e9, 100e9, 5.0, world=8, latency=(1e-4, 1e-3, 1e-3)), 5.0)
    assert m.choose(1024 * MIB) == "ring"  # 2 (W-1)/W of the bytes instead of log2 W whole payloads


def test_ties_go_to_plain_and_missing_timings_are_refused():
    same = {a: (1e-3, 2e-3) for a in ALGORITHMS}
    assert CostModel.from_timings(4, SIZES, same, 1.0).choose(MIB) == "plain"
    with pytest.raises(InvalidArgumentError, match="ring"):
        CostModel.from_timings(2, SIZES, {"plain": (1, 2)}, 2.0)


def test_calibration_sizes_setting(monkeypatch):
    with defaults.set(collective_calibration_kib="1024,32768"):
        assert autotune.calibration_bytes(torch.device("cuda", 0)) == (1024 * 1024, 32 * 1024 * 1024)
        assert autotune.calibration_bytes(torch.device("cpu")) == (16 * 1024, 512 * 1024)
    for bad in ("32768,1024", "1024", "a,b"):  # refused when set, so a calibration never meets one
        with pytest.raises(InvalidArgumentError, match="collective_calibration_kib"):
            defaults.set(collective_calibration_kib=bad)
        monkeypatch.setenv("VISEMZ_COLLECTIVE_CALIBRATION_KIB", bad)
        with pytest.raises(InvalidArgumentError, match="VISEMZ_COLLECTIVE_CALIBRATION_KIB"):
            config.from_env()


def test_script_formulas_and_limits():
    size, alpha, bw = 1 << 30, 5e-6, 12.5e9
    assert cm.plain_seconds(size, 2, alpha, bw) == pytest.approx(2 * alpha + size / bw)
    free = {"ratio": 1.0, "encode_GBps": float("inf"), "decode_GBps": float("inf"),
            "homomorphic_add_GBps": float("inf")}
    # free codecs at ratio 1: the ring moves the same bytes, plus the reduce-scatter phase's 63 size words
    # and the 63 steps of the all_gather of the all-gather phase's sizes
    extra, plain_latency = 2 * 63 * alpha, 2 * 63 * alpha
    assert cm.compressed_seconds(size, 64, alpha, bw, free) == \
        pytest.approx(cm.plain_seconds(size, 64, alpha, bw) + extra)
    c = dict(free, ratio=4.0)
    # with free codecs, a 4x ratio divides the bandwidth term by 4
    want = plain_latency + extra + (cm.plain_seconds(size, 64, alpha, bw) - plain_latency) / 4
    assert cm.compressed_seconds(size, 64, alpha, bw, c) == pytest.approx(want)
    slow = dict(c, encode_GBps=100.0, decode_GBps=100.0, homomorphic_add_GBps=50.0)
    codec = size / 100e9 * 2 + size * 63 / 64 / 50e9
    assert cm.compressed_seconds(size, 64, alpha, bw, slow) == pytest.approx(want + codec)


def test_script_prints_a_labelled_model(tmp_path, capsys):
    row = {"ratio": 5.0, "encode_GBps": 400.0, "decode_GBps": 500.0, "homomorphic_add_GBps": 300.0}
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps({"device": "test", "codecs": {"image/eb=0.0001": row}}))
    cm.main([str(bench)])
    out = capsys.readouterr().out
    assert "Model" in out and out.count("\n| ") == 2 + 2 * 7  # header, rule, 7 world sizes per bandwidth
    assert "| ring |" in out or "| recursive_doubling |" in out
    with pytest.raises(SystemExit, match="no codec row"):
        cm.main([str(bench), "--case", "nope"])


CODEC = {"ratio": 2.5, "encode_GBps": 229.0, "decode_GBps": 346.0, "homomorphic_add_GBps": 109.0}


def _rows_of_the_model(world: int, alpha: float, link_Bps: float, corrections: tuple) -> dict:
    """A measured JSON whose compressed rows are the corrected model's own times on ``world`` GPUs."""
    rows = [{"op": "all_reduce", "data": "image", "algorithm": "nccl", "bytes": 1 << 30, "eb": None,
             "seconds": (1 << 30) * 2 * (world - 1) / world / link_Bps}]
    for a in ("ring", "recursive_doubling"):
        for mb in (1, 16, 256, 1024):
            t = cm.model(world, alpha, link_Bps, CODEC, corrections).seconds(a, mb * MIB)
            rows.append({"op": "all_reduce", "data": "image", "algorithm": a, "bytes": mb * MIB, "eb": 1e-4,
                         "seconds": t})
    return {"world": world, "device": "test", "rows": rows}


def test_corrections_are_recovered_from_measurements_built_with_them(tmp_path, capsys):
    """Rows made by the corrected model itself give back its corrections, and the script's check
    table prints them beside the measured times."""
    alpha, world, link_Bps = 5e-6, 2, 4e9
    truth = (1.6e-3, 3.5)
    measured = _rows_of_the_model(world, alpha, link_Bps, truth)
    bw, pairs = cm.measured_rows(measured, {"image/eb=0.0001": CODEC}, "image")
    assert bw == pytest.approx(link_Bps) and len(pairs) == 8
    assert cm.fit([(world, bw, pairs)], alpha) == pytest.approx(truth, rel=1e-6)
    # the script: fit, check table, corrected extrapolation
    bench, meas = tmp_path / "codecs.json", tmp_path / "measured.json"
    bench.write_text(json.dumps({"device": "test", "codecs": {"image/eb=0.0001": CODEC}}))
    meas.write_text(json.dumps(measured))
    cm.main([str(bench), "--measured", str(meas)])
    out = capsys.readouterr().out
    assert "1.60 ms per compressed exchange" in out and "3.50x" in out and "with measured corrections" in out


def test_one_fit_over_two_world_sizes_and_a_check_on_rows_not_fitted_to(tmp_path, capsys):
    """Two- and four-GPU rows of one model are fitted together back to its corrections; a ``--check``
    file's rows are printed against the fit without moving it (rows of another model would)."""
    alpha, truth = 5e-6, (1.1e-3, 5.2)
    bench = tmp_path / "codecs.json"
    bench.write_text(json.dumps({"device": "test", "codecs": {"image/eb=0.0001": CODEC}}))
    paths = []
    for world, link_Bps, corr in ((2, 3e9, truth), (4, 3.3e9, truth), (4, 3.3e9, (9e-3, 1.0))):
        paths.append(tmp_path / f"m{len(paths)}.json")
        paths[-1].write_text(json.dumps(_rows_of_the_model(world, alpha, link_Bps, corr)))
    cm.main([str(bench), "--measured", str(paths[0]), str(paths[1]), "--check", str(paths[2])])
    out = capsys.readouterr().out
    assert "Fitted to 16 measured compressed all_reduces" in out and "1.10 ms per compressed exchange" in out
    assert "5.20x" in out and "m2.json (not fitted to): 4x test" in out and out.count("(fitted)") == 2


def test_measured_rows_pair_each_row_with_its_predictors_codec_and_keep_one_api():
    """Rows with a predictor take that predictor's codec row; rows without one (or 'none') take the
    codec without prediction, also from a JSON written before predictors; --api keeps one API."""
    plain_codec = {"ratio": 2.5, "encode_GBps": 300.0, "decode_GBps": 400.0, "homomorphic_add_GBps": 100.0}
    lorenzo = dict(plain_codec, ratio=3.6)
    nccl = {"op": "all_reduce", "data": "image", "algorithm": "nccl", "bytes": MIB, "eb": None, "seconds": 1e-3}
    rows = [nccl] + [{"op": "all_reduce", "data": "image", "algorithm": a, "bytes": MIB, "eb": 1e-4, "seconds": 2e-3,
                      "predictor": p, "api": api}
                     for a in ("ring", "recursive_doubling") for p in ("none", "lorenzo")
                     for api in ("functional", "plan")]
    measured = {"world": 2, "rows": rows}
    new = {"image/eb=0.0001/none": plain_codec, "image/eb=0.0001/lorenzo": lorenzo}
    _, pairs = cm.measured_rows(measured, new, "image", "plan")
    assert len(pairs) == 4 and all(r["api"] == "plan" for r, _ in pairs)
    assert all(c is (lorenzo if r["predictor"] == "lorenzo" else plain_codec) for r, c in pairs)
    _, pairs = cm.measured_rows(measured, {"image/eb=0.0001": plain_codec}, "image")  # an old codec JSON
    assert len(pairs) == 4 and all(r["predictor"] == "none" and c is plain_codec for r, c in pairs)


def test_fit_corrections_needs_separable_samples():
    with pytest.raises(InvalidArgumentError, match="at least 2"):
        fit_corrections([(1.0, 1, 1.0, 1.0)])
    with pytest.raises(InvalidArgumentError, match="do not separate"):
        fit_corrections([(1.0, 1, 1.0, 1.0), (2.0, 2, 2.0, 1.0)])  # codec time proportional to exchanges
    assert fit_corrections([(1.0, 1, 0.0, 1.0), (3.0, 1, 1.0, 1.0)]) == pytest.approx((1.0, 2.0))


def test_a_plans_chooser_keeps_its_answer_until_the_model_or_the_ratio_changes(monkeypatch):
    """Chooser asks the model once per (model, observed ratio): a call that keeps its choice reads two dicts,
    and a new ratio (observe), a new model (use_model) or none (recalibration) is asked again."""
    from visemz.collectives import ErrorBounded

    class Group:  # any weakly referenceable object keys the state; the model is installed, never calibrated
        pass

    group, codec = Group(), ErrorBounded(1e-3)
    asked = []
    real = CostModel.choose
    monkeypatch.setattr(CostModel, "choose", lambda self, n, r=None: asked.append((n, r)) or real(self, n, r))
    slow_link = CostModel.from_timings(2, SIZES, timings(1e8, 1e11, 4.0), 4.0)  # compressing pays
    fast_link = CostModel.from_timings(2, SIZES, timings(1e12, 1e9, 4.0), 4.0)  # plain wins
    autotune.use_model(group, codec, "float32", slow_link)
    choose = autotune.Chooser(group, codec, "float32", 64 * MIB)
    flat = torch.zeros(4)
    first = choose(flat)
    assert first in ("ring", "recursive_doubling") and all(choose(flat) == first for _ in range(5))
    assert asked == [(64 * MIB, None)]
    autotune.observe(group, codec, "float32", 64 * MIB, 64 * MIB)  # ratio 1: compressing no longer pays
    assert choose(flat) == "plain" and asked[-1] == (64 * MIB, 1.0) and len(asked) == 2
    autotune.use_model(group, codec, "float32", fast_link)
    assert choose(flat) == "plain" and len(asked) == 3
    assert choose(flat) == "plain" and len(asked) == 3

