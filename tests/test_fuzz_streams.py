"""tools/fuzz_streams.py: a few hundred variants of every stream kind, and its accounting of what it finds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from visemz.errors import CorruptStreamError
from visemz.image import image_header

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import fuzz_streams  # noqa: E402


def test_a_few_hundred_variants_of_every_kind_find_nothing(tmp_path, model_weights):
    report = fuzz_streams.main([str(tmp_path), "420", "--seed", "1", "--report-every", "200"])
    assert report["variants_run"] >= 380
    kinds = {"block", "ints", "rans", "image-v2", "image-v3", "image-v4", "image-v5", "image-v6",
             f"image-v{image_header.FORMAT}", f"image-v{image_header.INTEGER}", f"image-v{image_header.CALIBRATED}",
             "pages", "eb", "ll", "zarr", "legacy"}
    assert set(report["by_kind"]) == kinds
    assert report["by_mode"]["raw"] > 100 and report["by_mode"]["resealed"] > 100
    # resealed variants reach the parsers behind the checksums, not only the checksums
    assert any(site.startswith("resealed") and "checksum" not in site for site in report["error_sites"])
    assert report["non_visemz_exceptions"] == 0 and report["silent_wrong_outputs"] == 0 and report["hangs"] == 0, \
        report["findings"]
    assert json.loads((tmp_path / "report.json").read_text())["variants_run"] == report["variants_run"]


def test_findings_are_counted_and_kept_with_a_reproducer(tmp_path):
    seed = fuzz_streams.Seed("eb", "eb-test", b"seed", lambda b: None, "decode(buf)",
                             out=fuzz_streams._as_bytes(np.zeros(3)), values=3, peak=1000)
    report = fuzz_streams.Report(tmp_path, 4, 0)
    cases = [fuzz_streams.Case(None, ValueError("bare"), 0.01, 0.01, 10, 0),
             fuzz_streams.Case(np.ones(3), None, 0.01, 0.01, 10, 0),
             fuzz_streams.Case(None, CorruptStreamError("damaged"), 2.5, 2.5, 10**6, 0)]
    for i, case in enumerate(cases):
        fuzz_streams._account(report, i, seed, "raw", "flip", b"bytes %d" % i, case)
    d = report.save()
    assert (d["non_visemz_exceptions"], d["silent_wrong_outputs"], d["over_time"], d["over_time_wall"],
            d["over_memory"]) == (1, 1, 1, 1, 1)
    assert d["visemz_errors"] == {"CorruptStreamError": 1}
    kept = {f["finding"]: f for f in d["findings"]}
    assert set(kept) == {"non-visemz exception", "silent wrong output", "over 2 s", "over the memory allowance"}
    assert (tmp_path / kept["non-visemz exception"]["file"]).read_bytes() == b"bytes 0"
    assert "ValueError: bare" in kept["non-visemz exception"]["detail"]
