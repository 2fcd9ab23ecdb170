"""scripts/error_bands.py: the error's frequency bands, and the script end to end on a small image."""

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import error_bands  # noqa: E402


def test_a_constant_offset_is_all_low_band_and_a_checkerboard_all_high_band():
    original = np.full((96, 96), 100, np.uint8)
    offset = error_bands.bands(original, original + np.uint8(2))
    assert offset["mse"] == pytest.approx(4.0) and offset["low"] == pytest.approx(4.0, rel=1e-3)
    assert offset["high"] == pytest.approx(0.0, abs=1e-3)
    checker = (99 + 2 * (np.indices(original.shape).sum(0) % 2)).astype(np.uint8)  # 100 -+ 1: no mean error
    fine = error_bands.bands(original, checker)
    assert fine["high"] > 0.9 * fine["mse"] and fine["low"] < 0.01 * fine["mse"]


def test_the_script_measures_real_files_of_both_codecs(tmp_path):
    path = tmp_path / "camera.png"
    cv2.imwrite(str(path), data.camera()[::4, ::4])  # 128 x 128, 8-bit gray
    out = tmp_path / "bands.json"
    rows = error_bands.main(["--image", str(path), "--qualities", "2", "--j2k-bpp", "0.5", "--device", "cpu",
                             "--out", str(out)])
    assert [r["codec"] for r in rows] == ["visemz-mbt2018-mean", "jpeg2000"]
    assert all(r["bpp"] > 0 and 15 < r["psnr"] < 60 for r in rows)
    assert json.loads(out.read_text())["rows"] == rows


def test_a_16_bit_image_is_refused_naming_it(tmp_path):
    path = tmp_path / "deep.png"
    cv2.imwrite(str(path), np.zeros((8, 8), np.uint16))
    with pytest.raises(SystemExit, match="deep.png"):
        error_bands.main(["--image", str(path)])
