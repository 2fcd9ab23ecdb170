"""visemz.measure: the one PSNR (peak per dtype), bpp and timing statistic every report uses."""

import math

import numpy as np
import pytest

from visemz import measure
from visemz.errors import InvalidArgumentError


def test_psnr_of_a_known_error():
    ref = np.full((32, 32), 100, np.uint8)
    rec = ref.copy()
    rec[::2] += 5  # half the pixels off by 5: MSE 12.5
    assert measure.psnr(ref, rec) == pytest.approx(10 * math.log10(255**2 / 12.5), abs=1e-9)
    assert measure.psnr(ref, ref) == math.inf
    assert measure.max_abs_error(ref, rec) == 5
    ref16 = ref.astype(np.uint16) * 257
    rec16 = ref16.copy()
    rec16[::2] += 257  # same error relative to the bit depth's range
    assert measure.psnr(ref16, rec16) == pytest.approx(10 * math.log10(65535**2 / 257**2 / 0.5), abs=1e-9)


def test_peak_per_dtype():
    assert measure.peak(np.zeros(3, np.uint8)) == 255 and measure.peak(np.zeros(3, np.uint16)) == 65535
    assert measure.peak(np.array([-2.0, 1.5], np.float32)) == 3.5  # a float reference: its own value range
    assert measure.peak(np.array([7.0, 7.0])) == 1.0  # constant: 1, so a PSNR still exists
    ref = np.array([[0.0, 10.0], [4.0, 6.0]])
    assert measure.psnr(ref, ref + 1) == pytest.approx(20.0)  # 10 log10(10^2 / 1)
    assert measure.psnr(ref, ref + 1, data_range=1.0) == pytest.approx(0.0)
    with pytest.raises(InvalidArgumentError, match="bool"):
        measure.peak(np.zeros(3, bool))
    with pytest.raises(InvalidArgumentError, match=r"\(2, 3\)"):
        measure.psnr(np.zeros((2, 2)), np.zeros((2, 3)))


def test_bpp_counts_real_bytes_per_pixel():
    assert measure.bpp(100, measure.pixel_count((40, 20))) == pytest.approx(1.0)
    assert measure.pixel_count((40, 20, 3)) == 800  # per pixel, not per channel value
    assert measure.pixel_count((5, 40, 20, 3), paged=True) == 4000  # a page stack: every page's pixels


def test_median_seconds_runs_what_it_says():
    calls, resets, syncs = [], [], []
    seconds, last = measure.median_seconds(lambda: calls.append(1) or len(calls), 3, warmup=2,
                                           sync=lambda: syncs.append(1), reset=lambda: resets.append(1))
    # a sync before and after each timed call
    assert len(calls) == 5 and last == 5 and len(resets) == 5 and len(syncs) == 6
    assert seconds >= 0
    with pytest.raises(InvalidArgumentError, match="reps=0"):
        measure.median_seconds(lambda: None, 0)
