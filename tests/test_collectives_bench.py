"""scripts/bench_collectives.py end to end on CPU tensors over Gloo (2 processes): a smoke test of
the script (rows, formulas, report), not a benchmark."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_collectives.py"


@pytest.mark.timeout(240)
def test_bench_runs_every_op_and_writes_its_report(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
           "--device", "cpu", "--kinds", "smooth", "--label", "cpu", "--out", str(out),
           "--ops", "all_reduce,all_to_all,scatter", "--sizes-mb", "0.0625", "--ebs", "1e-2", "--reps", "1",
           "--predictors", "none,lorenzo", "--api", "functional,plan"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    report = json.loads(out.read_text())
    assert report["world"] == 2 and report["rows"] == lines  # each row printed as it came
    variants = {(x["algorithm"], x.get("predictor"), x.get("api")) for x in report["rows"] if x["op"] == "all_reduce"}
    assert {(a, p, api) for a in ("ring", "recursive_doubling", "auto") for p in ("none", "lorenzo")
            for api in ("functional", "plan")} <= variants  # every predictor through both APIs
    rows = {(x["op"], x["algorithm"]): x for x in report["rows"]}
    assert set(rows) == {("all_reduce", a) for a in ("nccl", "plain", "ring", "recursive_doubling", "auto")} | {
        (op, a) for op in ("all_to_all", "scatter") for a in ("nccl", "plain", "compressed")}
    auto = rows[("all_reduce", "auto")]
    assert auto["auto_choice"] in ("plain", "ring", "recursive_doubling") and set(auto["auto_estimates_ms"]) == {
        "plain", "ring", "recursive_doubling"} and auto["auto_calibration_s"] > 0
    for x in report["rows"]:
        factor = 2 * (2 - 1) / 2 if x["op"] == "all_reduce" else (2 - 1) / 2  # nccl-tests' busbw factors, W = 2
        assert x["busbw_GBps"] == pytest.approx(x["algbw_GBps"] * factor)
        assert x["algbw_GBps"] == pytest.approx(x["bytes"] / x["seconds"] / 1e9)
    assert rows[("scatter", "compressed")]["psnr_db"] > 40 and rows[("all_to_all", "compressed")]["psnr_db"] > 40
