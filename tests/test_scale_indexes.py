"""Scale -> table index on every device alike: CompressAI's rule, the exception list, its checks."""

import numpy as np
import pytest

from visemz.encoders import encode_ints
from visemz.encoders.cdf_tables import default_scale_table
from visemz.encoders.scale_indexes import (
    DEFAULT_REL_TOL,
    decode_and_apply_scale_exceptions,
    encode_scale_exceptions,
    scale_indexes,
)
from visemz.errors import CorruptStreamError, InvalidArgumentError, VisemzError

TABLE = default_scale_table()
TOL = DEFAULT_REL_TOL


def scales_near_boundaries(n: int, seed: int) -> np.ndarray:
    """Log-uniform scales, with a third of them within a few rel_tol of a table boundary (or on it)."""
    rng = np.random.default_rng(seed)
    s = np.exp(rng.uniform(np.log(0.02), np.log(400), n))
    near = rng.choice(n, n // 3, replace=False)
    s[near] = TABLE[rng.integers(0, TABLE.size - 1, near.size)] * (1 + rng.uniform(-3, 3, near.size) * TOL)
    s[near[:20]] = TABLE[rng.integers(0, TABLE.size - 1, 20)]  # exactly on a boundary
    return s


def test_indexes_follow_compressai_build_indexes():
    import torch
    from compressai.entropy_models import GaussianConditional

    gc = GaussianConditional(TABLE.tolist())
    gc.scale_table = torch.from_numpy(TABLE)  # float64, as visemz computes
    s = scales_near_boundaries(20_000, seed=1)
    s[:5] = [0.0, 1e-9, 0.11, 256.0, 1e9]
    idx, _ = scale_indexes(s, TABLE)
    ref = gc.build_indexes(torch.from_numpy(s)).numpy()
    np.testing.assert_array_equal(idx, ref)


def test_listed_positions_are_exactly_those_near_a_boundary():
    s = scales_near_boundaries(30_000, seed=2).reshape(3, 100, 100)
    idx, amb = scale_indexes(s, TABLE)
    assert idx.shape == s.shape and idx.dtype == np.int32
    flat = s.reshape(-1)
    rel = np.min(np.abs(flat[:, None] / TABLE[None, :-1] - 1), axis=1)
    assert set(amb.tolist()) >= set(np.flatnonzero(rel <= 0.99 * TOL).tolist())
    assert set(amb.tolist()) <= set(np.flatnonzero(rel <= 1.01 * TOL).tolist())


@pytest.mark.parametrize("seed", range(4))
def test_decoder_with_perturbed_scales_recovers_the_encoders_indexes(seed):
    """Another device's float64 scales: off by up to rel_tol / 2 (far more than float64 rounding)."""
    s = scales_near_boundaries(40_000, seed)
    idx, amb = scale_indexes(s, TABLE)
    section = encode_scale_exceptions(idx, amb)
    rng = np.random.default_rng(100 + seed)
    other = s * (1 + rng.uniform(-0.5, 0.5, s.size) * TOL)
    mine, _ = scale_indexes(other, TABLE)
    assert np.any(mine != idx)  # the perturbation does move indexes; the list must put them back
    np.testing.assert_array_equal(decode_and_apply_scale_exceptions(section, other, TABLE), idx)


def test_no_exceptions_is_an_empty_section():
    s = np.full(1000, 1.0)
    idx, amb = scale_indexes(s, TABLE)
    assert amb.size == 0 and encode_scale_exceptions(idx, amb) == b""
    np.testing.assert_array_equal(decode_and_apply_scale_exceptions(b"", s, TABLE), idx)


def test_bad_scales_and_tables_are_refused():
    with pytest.raises(InvalidArgumentError, match="float64"):
        scale_indexes(np.ones(3, np.float32), TABLE)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        scale_indexes(np.array([1.0, np.nan]), TABLE)
    with pytest.raises(InvalidArgumentError, match="increasing"):
        scale_indexes(np.ones(3), TABLE[::-1])
    with pytest.raises(InvalidArgumentError, match="rel_tol"):
        scale_indexes(np.ones(3), TABLE, rel_tol=0.1)


def section(values) -> bytes:
    return encode_ints(np.asarray(values, np.int32), policy="global", entropy="none")


def test_inconsistent_exception_lists_are_refused():
    s = np.full(100, 2.0)
    s[[10, 20, 30]] = TABLE[[5, 9, 12]] * (1 + 0.3 * TOL)  # near boundaries 5, 9 and 12
    idx, amb = scale_indexes(s, TABLE)
    np.testing.assert_array_equal(amb, [10, 20, 30])
    good = [10, 10, 10, int(idx[10]), int(idx[20]), int(idx[30])]
    np.testing.assert_array_equal(decode_and_apply_scale_exceptions(section(good), s, TABLE), idx)
    flipped = good[:3] + [int(idx[10]) - 1, int(idx[20]), int(idx[30])]  # the other side of boundary 5: allowed
    assert decode_and_apply_scale_exceptions(section(flipped), s, TABLE)[10] == idx[10] - 1
    bad = {
        "not near a boundary": [11, 10, 10, 6, 10, 13],  # position 11 has scale 2.0
        "index two away": [10, 10, 10, int(idx[10]) + 2, int(idx[20]), int(idx[30])],
        "index out of range": [10, 10, 10, 64, int(idx[20]), int(idx[30])],
        "negative index": [10, 10, 10, -1, int(idx[20]), int(idx[30])],
        "unsorted": [10, 10, -5, int(idx[10]), int(idx[20]), int(idx[30])],
        "repeated": [10, 0, 10, int(idx[10]), int(idx[10]), int(idx[20])],
        "past the end": [10, 10, 80, int(idx[10]), int(idx[20]), 0],
        "negative start": [-1, 11, 10, 0, int(idx[10]), int(idx[20])],
        "odd count": [10, 10, 10, int(idx[10]), int(idx[20])],
        "empty list": [],
    }
    for values in bad.values():
        with pytest.raises(CorruptStreamError):
            decode_and_apply_scale_exceptions(section(values), s, TABLE)
    with pytest.raises(CorruptStreamError):
        decode_and_apply_scale_exceptions(b"\0" * 40, s, TABLE)  # not an ints stream


@pytest.mark.gpu
def test_cupy_scales_give_the_numpy_indexes_and_list():
    import cupy as cp

    s = scales_near_boundaries(200_000, seed=9).reshape(2, 100, 1000)
    idx, amb = scale_indexes(s, TABLE)
    gidx, gamb = scale_indexes(cp.asarray(s), TABLE)
    np.testing.assert_array_equal(gidx.get(), idx)
    np.testing.assert_array_equal(gamb.get(), amb)
    sec = encode_scale_exceptions(gidx, gamb)
    assert sec == encode_scale_exceptions(idx, amb)
    other = s * (1 + np.random.default_rng(3).uniform(-0.5, 0.5, s.shape) * TOL)
    back = decode_and_apply_scale_exceptions(sec, cp.asarray(other), TABLE)
    assert isinstance(back, cp.ndarray)
    np.testing.assert_array_equal(back.get(), idx)


@pytest.mark.gpu
def test_cupy_scales_are_refused_like_numpy_ones():
    """On a GPU the finite check shares one host read with the count of listed positions: the errors, and
    their order (the scales' before the table's and rel_tol's), stay those of the CPU."""
    import cupy as cp

    nan = cp.asarray(np.array([1.0, np.nan]))
    with pytest.raises(InvalidArgumentError, match="float64"):
        scale_indexes(cp.ones(3, cp.float32), TABLE)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        scale_indexes(nan, TABLE)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        scale_indexes(cp.asarray(np.array([np.inf, 1.0])), TABLE)
    for bad_table, tol in ((TABLE[::-1], TOL), (TABLE, 0.1)):
        with pytest.raises(InvalidArgumentError, match="NaN"):
            scale_indexes(nan, bad_table, rel_tol=tol)
    with pytest.raises(InvalidArgumentError, match="increasing"):
        scale_indexes(cp.ones(3), TABLE[::-1])
    with pytest.raises(InvalidArgumentError, match="rel_tol"):
        scale_indexes(cp.ones(3), TABLE, rel_tol=0.1)
    idx, amb = scale_indexes(cp.full(1000, 1.0), TABLE)  # nothing near a boundary: an empty int64 list
    assert isinstance(amb, cp.ndarray) and amb.dtype == cp.int64 and amb.size == 0
    assert encode_scale_exceptions(idx, amb) == b""
    np.testing.assert_array_equal(idx.get(), scale_indexes(np.full(1000, 1.0), TABLE)[0])
    empty_idx, empty_amb = scale_indexes(cp.zeros(0, cp.float64), TABLE)
    assert empty_idx.size == 0 and empty_amb.size == 0


@pytest.mark.parametrize("xp_name", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_the_decoders_errors_and_their_order_are_the_same_on_both_devices(xp_name):
    """decode_and_apply_scale_exceptions: non-finite scales are refused before a bad table or rel_tol and
    before a damaged section, on a GPU (where the finite check is read with the indexes' counts) as on the CPU."""
    xp = np if xp_name == "numpy" else pytest.importorskip("cupy")
    nan = xp.asarray(np.array([1.0, np.nan]))
    good = xp.asarray(np.linspace(0.2, 20.0, 1000))
    damaged = b"\\x07garbage"
    for scales, table, tol, buf, match in (
            (nan, TABLE, TOL, b"", "NaN"), (nan, TABLE[::-1], TOL, b"", "NaN"), (nan, TABLE, 0.1, b"", "NaN"),
            (nan, TABLE, TOL, damaged, "NaN"), (good, TABLE[::-1], TOL, b"", "increasing"),
            (good, TABLE, 0.1, b"", "rel_tol")):
        with pytest.raises(InvalidArgumentError, match=match):
            decode_and_apply_scale_exceptions(buf, scales, table, rel_tol=tol)
    with pytest.raises(VisemzError):
        decode_and_apply_scale_exceptions(damaged, good, TABLE)
    got = decode_and_apply_scale_exceptions(b"", good, TABLE)
    np.testing.assert_array_equal(got.get() if xp is not np else got,
                                  scale_indexes(np.linspace(0.2, 20.0, 1000), TABLE)[0])
