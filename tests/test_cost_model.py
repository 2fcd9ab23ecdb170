"""scripts/cost_model.py: the alpha-beta formulas and the table it prints."""

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("cost_model", Path(__file__).parents[1] / "scripts" / "cost_model.py")
cm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cm)


def test_ring_formula_and_limits():
    size, alpha, bw = 1 << 30, 5e-6, 12.5e9
    assert cm.plain_seconds(size, 2, alpha, bw) == pytest.approx(2 * alpha + size / bw)
    free = {"ratio": 1.0, "encode_GBps": float("inf"), "decode_GBps": float("inf"), "homomorphic_add_GBps": float("inf")}
    assert cm.compressed_seconds(size, 64, alpha, bw, free) == pytest.approx(cm.plain_seconds(size, 64, alpha, bw))
    c = dict(free, ratio=4.0)
    # with free codecs, a 4x ratio divides the bandwidth term by 4
    want = 2 * 63 * alpha + (cm.plain_seconds(size, 64, alpha, bw) - 2 * 63 * alpha) / 4
    assert cm.compressed_seconds(size, 64, alpha, bw, c) == pytest.approx(want)


def test_script_prints_a_labelled_model(tmp_path, capsys, monkeypatch):
    row = {"ratio": 5.0, "encode_GBps": 400.0, "decode_GBps": 500.0, "homomorphic_add_GBps": 300.0}
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps({"device": "test", "codecs": {"image/eb=0.0001": row}}))
    monkeypatch.setattr("sys.argv", ["cost_model.py", str(bench)])
    cm.main()
    out = capsys.readouterr().out
    assert "Model" in out and out.count("\n| ") == 2 + 2 * 7  # header, rule, 7 world sizes per bandwidth
    monkeypatch.setattr("sys.argv", ["cost_model.py", str(bench), "--case", "nope"])
    with pytest.raises(SystemExit, match="no codec row"):
        cm.main()
