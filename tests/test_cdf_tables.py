"""Integer CDF tables: construction from CompressAI's entropy models, quantisation, storage, validation."""

import numpy as np
import pytest

from visemz.encoders.cdf_tables import (
    TOTAL,
    CdfTables,
    default_scale_table,
    from_pmfs,
    gaussian_scale_tables,
    quantize_pmf,
)
from visemz.encoders.rans import decode_conditional, encode_conditional
from visemz.errors import InvalidArgumentError

from .rans_cases import gaussian_tables


def every_table(tables: CdfTables):
    for t in range(tables.n_tables):
        yield t, tables.cdf[tables.cdf_start[t] : tables.cdf_start[t + 1]].astype(np.int64)


def gaussian_pmf(scale: float, center: int) -> np.ndarray:
    """The exact (float64) pmf of values -center..center and the escape, as GaussianConditional defines it."""
    from scipy import special

    phi = lambda x: 0.5 * special.erfc(-x / np.sqrt(2))
    v = np.abs(np.arange(-center, center + 1, dtype=np.float64))
    return np.append(phi((0.5 - v) / scale) - phi((-0.5 - v) / scale), 2 * phi((-0.5 - center) / scale))


def cross_entropy(p: np.ndarray, cdf: np.ndarray) -> float:
    return float(-(p * np.log2(np.diff(cdf) / TOTAL)).sum())


def test_gaussian_tables_code_compressais_distributions_at_least_as_well():
    import torch
    from compressai.entropy_models import GaussianConditional

    ours = gaussian_tables()
    gc = GaussianConditional(None)
    gc.update_scale_table(torch.from_numpy(default_scale_table()).float())
    assert ours.n_tables == 64
    for t, cdf in every_table(ours):
        assert cdf[0] == 0 and cdf[-1] == TOTAL and np.all(np.diff(cdf) >= 1)
        length = int(gc.cdf_length[t])  # CompressAI: its values, the escape, and the closing 2**16
        center = (cdf.size - 3) // 2
        assert abs(cdf.size - length) <= 2 and ours.offsets[t] == -center
        if cdf.size == length:  # same support: compare the expected code lengths under the exact pmf
            p = gaussian_pmf(default_scale_table()[t], center)
            theirs = gc.quantized_cdf[t, :length].numpy().astype(np.int64)
            assert cross_entropy(p, cdf) <= cross_entropy(p, theirs) + 1e-6
    assert ours.offsets[0] == -1 and ours.offsets[-1] == -1565  # ceil(0.11 q) and ceil(256 q), q = 6.109


def test_quantised_pmfs_sum_to_two_to_the_16_and_lose_no_more_than_compressais():
    from compressai._CXX import pmf_to_quantized_cdf

    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 50, 3000, TOTAL):
        p = rng.dirichlet(np.full(size, 0.3))
        p[rng.random(size) < 0.2] = 0  # zeros still get a frequency of 1
        if p.sum() == 0:
            p[0] = 1
        f = quantize_pmf(p)
        assert f.sum() == TOTAL and f.min() >= 1 and f.dtype == np.int64
        if size >= TOTAL:
            continue
        q = p / p.sum()
        nz = q > 0
        loss = lambda freq: float((q[nz] * np.log2(q[nz] * TOTAL / freq[nz])).sum())  # bits beyond the entropy
        theirs = np.diff(np.asarray(pmf_to_quantized_cdf(q.tolist(), 16), np.int64))
        assert loss(f) <= loss(theirs) + 1e-9, (size, loss(f), loss(theirs))
        assert loss(f) < (0.001 if size <= 50 else 0.03)
    np.testing.assert_array_equal(quantize_pmf([1.0]), [TOTAL])
    np.testing.assert_array_equal(quantize_pmf([0.5, 0.5]), [TOTAL // 2, TOTAL // 2])
    for bad in ([], [-0.1, 1.1], [np.nan, 1], [0, 0], np.ones(TOTAL + 1)):
        with pytest.raises(InvalidArgumentError):
            quantize_pmf(bad)


def bottleneck_tables(channels: int = 16):
    """A trained-looking EntropyBottleneck's CDFs, the way from_pmfs documents taking them."""
    import torch
    from compressai.entropy_models import EntropyBottleneck

    torch.manual_seed(0)
    eb = EntropyBottleneck(channels).double()
    with torch.no_grad():
        eb.quantiles.data = torch.tensor([-4.0, 0.2, 5.0], dtype=torch.float64).repeat(channels, 1, 1)
        eb.quantiles.data *= torch.linspace(0.3, 3.0, channels, dtype=torch.float64)[:, None, None]
    eb.update(force=True)
    medians = eb.quantiles[:, 0, 1].detach()
    minima = torch.clamp(torch.ceil(medians - eb.quantiles[:, 0, 0]), min=0).long()
    maxima = torch.clamp(torch.ceil(eb.quantiles[:, 0, 2] - medians), min=0).long()
    pmfs, tails = [], []
    with torch.no_grad():
        for c in range(channels):
            samples = medians[c] - minima[c] + torch.arange(int(minima[c] + maxima[c] + 1), dtype=torch.float64)
            x = samples.repeat(channels, 1, 1)  # _likelihood works per channel: row c is ours
            pmf, lower, upper = eb._likelihood(x, stop_gradient=True)
            pmfs.append(pmf[c, 0].numpy())
            tails.append(float(torch.sigmoid(lower[c, 0, 0]) + torch.sigmoid(-upper[c, 0, -1])))
    return eb, from_pmfs(pmfs, tails, (-minima).numpy())


def test_factorized_tables_from_an_entropy_bottleneck_code_its_symbols():
    eb, tables = bottleneck_tables()
    np.testing.assert_array_equal(tables.offsets, eb._offset.numpy())
    np.testing.assert_array_equal(np.diff(tables.cdf_start), eb._cdf_length.numpy())
    rng = np.random.default_rng(1)
    idx = np.repeat(np.arange(16, dtype=np.int32), 2000)
    sym = np.round(rng.laplace(0, 0.2 + idx / 8)).astype(np.int32)
    buf = encode_conditional(sym, idx, tables)
    np.testing.assert_array_equal(decode_conditional(buf, idx, tables), sym)


def test_tables_survive_a_safetensors_file(tmp_path):
    from safetensors.numpy import load_file, save_file

    tables = gaussian_tables()
    save_file(tables.to_dict("rans."), str(tmp_path / "t.safetensors"))
    back = CdfTables.from_dict(load_file(str(tmp_path / "t.safetensors")), "rans.")
    assert back.fingerprint == tables.fingerprint
    sym, idx = np.arange(-5, 5, dtype=np.int32), np.arange(10, dtype=np.int32)
    assert encode_conditional(sym, idx, back) == encode_conditional(sym, idx, tables)
    with pytest.raises(InvalidArgumentError, match="rans.offsets"):
        CdfTables.from_dict({k: v for k, v in tables.to_dict("rans.").items() if k != "rans.offsets"}, "rans.")


def test_decoder_lookup_tables_point_at_the_right_symbols():
    tables = gaussian_tables()
    for t, cdf in every_table(tables):
        slots = np.arange(256) << 8
        s = tables.lut[t]
        assert np.all(cdf[s] <= slots) and np.all(slots < cdf[s + 1])


def test_code_length_costs_are_exact_floors():
    tables = gaussian_tables()
    freq = np.diff(tables.cdf.astype(np.int64), append=0)
    symbol = np.ones(tables.cdf.size, bool)
    symbol[tables.cdf_start[1:] - 1] = False
    approx = 4096 - 256 * np.log2(freq[symbol])
    assert np.all(tables.cost[symbol] >= approx - 1e-9) and np.all(tables.cost[symbol] < approx + 1)
    assert np.all(tables.cost[~symbol] == 0)


def test_invalid_tables_are_refused():
    good = gaussian_scale_tables([0.5, 2.0])
    cdf, start, off = (np.array(a) for a in (good.cdf, good.cdf_start, good.offsets))
    flat = cdf.copy()
    flat[2] = flat[1]  # a symbol of frequency 0
    cases = {
        "frequency 0": (flat, start, off),
        "wrong end": (np.where(np.arange(cdf.size) == cdf.size - 1, TOTAL - 1, cdf), start, off),
        "start mismatch": (cdf, start + 1, off),
        "range without 0": (cdf, start, off + 50),
        "positive offset": (cdf, start, np.array([1, -1])),
        "one symbol": (np.array([0, TOTAL]), np.array([0, 2]), np.array([0])),
        "no tables": (np.zeros(0, np.int32), np.array([0]), np.zeros(0, np.int32)),
        "2-D": (cdf.reshape(1, -1), start, off),
        "float": (cdf.astype(np.float32), start, off),
    }
    for arrays in cases.values():
        with pytest.raises(InvalidArgumentError):
            CdfTables(*arrays)
    for bad in ([], [1.0, 0.5], [0.0, 1.0], [1.0, np.inf]):
        with pytest.raises(InvalidArgumentError):
            gaussian_scale_tables(bad)
    with pytest.raises(InvalidArgumentError):
        from_pmfs([[0.5, 0.5]], [1.5], [0])
    assert good.cdf.flags.writeable is False
