"""scripts/symbol_codings.py end to end on small real images: both codings' bytes, the summary, and that they
are what the codec writes (the smaller one, except for a hyperprior model's y: rANS alone)."""

import json
import sys
from pathlib import Path

import cv2
import numpy as np
from skimage import data

import visemz
from visemz import container, latents, tile_index

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import symbol_codings  # noqa: E402


def test_the_script_reports_both_codings_of_every_section(tmp_path):
    (tmp_path / "data" / "rgb").mkdir(parents=True)
    (tmp_path / "data" / "gray").mkdir()
    cv2.imwrite(str(tmp_path / "data" / "rgb" / "coffee.png"), np.ascontiguousarray(data.coffee()[:128, :192, ::-1]))
    cv2.imwrite(str(tmp_path / "data" / "gray" / "flat.png"), np.full((128, 128), 37, np.uint8))
    out = tmp_path / "codings.jsonl"
    summary = symbol_codings.main(["--data", str(tmp_path / "data"), "--models", "mbt2018-mean,balle2016",
                                   "--qualities", "4", "--device", "cpu", "--out", str(out)])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    rows, last = lines[:-1], lines[-1]
    assert last == {"summary": summary} and len(rows) == 4
    assert {(s["model"], s["section"], s["set"]) for s in summary} == {
        ("mbt2018-mean", "y", "rgb"), ("mbt2018-mean", "z", "rgb"), ("mbt2018-mean", "y", "gray"),
        ("mbt2018-mean", "z", "gray"), ("balle2016", "y", "rgb"), ("balle2016", "y", "gray")}
    codec = visemz.ImageCodec("cpu")
    for r in rows:
        img = cv2.imread(str(tmp_path / "data" / r["set"] / r["image"]), cv2.IMREAD_UNCHANGED)
        img = img[:, :, ::-1] if img.ndim == 3 else img
        c = container.unpack(codec.compress(np.ascontiguousarray(img), model=r["model"], quality=r["quality"]))
        t = c.meta["tiles"]
        index = tile_index.TileIndex(c.sections, 1, t["parts"], t["symbols"], c.meta["format"])
        for k, (rans, ints) in r["sections"].items():
            rans_only = (k == "y" and "z" in r["sections"]) or (k == "z" and r["z_zeros"] < latents.Z_INTS_MIN_ZEROS)
            want = rans if rans_only or rans <= ints else ints
            assert len(index.part(0, k)) == want, (r, k)
    assert all(("z_zeros" in r) == (r["model"] == "mbt2018-mean") for r in rows)
    flat = [r for r in rows if r["image"] == "flat.png" and r["model"] == "balle2016"][0]
    assert flat["sections"]["y"][1] < flat["sections"]["y"][0]  # a flat image: the ints stream wins
