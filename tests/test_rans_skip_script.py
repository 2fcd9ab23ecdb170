"""scripts/rans_skip.py end to end on small real images: every section at every threshold, the streams it
measures are the codec's (threshold 0: the bytes the codec writes), and the summary's ratios."""

import json
import sys
from pathlib import Path

import cv2
import numpy as np
from skimage import data

import visemz
from visemz import container, tile_index

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import rans_skip  # noqa: E402


def test_the_script_measures_every_section_at_every_threshold(tmp_path):
    (tmp_path / "data" / "rgb").mkdir(parents=True)
    (tmp_path / "data" / "gray").mkdir()
    cv2.imwrite(str(tmp_path / "data" / "rgb" / "coffee.png"), np.ascontiguousarray(data.coffee()[:128, :192, ::-1]))
    cv2.imwrite(str(tmp_path / "data" / "gray" / "camera.png"), data.camera()[:128, :128])
    out = tmp_path / "skip.jsonl"
    summary = rans_skip.main(["--data", str(tmp_path / "data"), "--qualities", "1", "--skips", "65531",
                              "--reps", "1", "--device", "cpu", "--out", str(out)])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0] == {"device": "CPU"} and lines[-1] == {"summary": summary}
    rows = lines[1:-1]
    assert {(r["set"], r["section"], r["skip"]) for r in rows} == {
        (s, k, f) for s in ("rgb", "gray") for k in ("y", "z") for f in (0, 65531)}
    codec = visemz.ImageCodec("cpu")
    for r in rows:
        assert r["coded"] <= r["symbols"] and r["steps"] >= 1 and r["encode_ms"] > 0 and r["decode_ms"] > 0
        assert (r["coded"] == r["symbols"]) == (r["skip"] == 0)  # the mbt2018-mean tables skip something
        if r["skip"] == 0 and r["section"] == "y":  # threshold 0: the stream the codec writes
            img = cv2.imread(str(tmp_path / "data" / r["set"] / r["image"]), cv2.IMREAD_UNCHANGED)
            img = img[:, :, ::-1] if img.ndim == 3 else img
            c = container.unpack(codec.compress(np.ascontiguousarray(img), model="mbt2018-mean", quality=1))
            t = c.meta["tiles"]
            index = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], c.meta["format"])
            assert len(index.part(0, "y")) == r["bytes"]
    by = {(s["set"], s["skip"]): s for s in summary}
    for set_name in ("rgb", "gray"):
        base, skip = by[(set_name, 0)], by[(set_name, 65531)]
        assert "bytes_ratio" not in base and skip["images"] == 1
        assert skip["bytes_ratio"] == round(skip["bytes"] / base["bytes"], 4)
        assert skip["y_steps_ratio"] < 1  # near-certain zeros left the lanes
