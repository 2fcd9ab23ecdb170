"""Conditional rANS on the GPU against the NumPy reference: identical bytes, cross decoding (marker gpu)."""

import numpy as np
import pytest

from visemz.encoders import rans_gpu
from visemz.encoders import rans_layout as RL
from visemz.encoders.rans import decode_conditional, encode_conditional
from visemz.errors import CorruptStreamError, InvalidArgumentError, VisemzError

from .rans_cases import KINDS, PLANS, SIZES, make_case
from .test_rans import GOLDEN_PLANS, GOLDEN_SKIP, SKIPS, golden_inputs, reframe3, with_body

pytestmark = pytest.mark.gpu


def check_both_ways(cp, sym, idx, tables, **plan):
    ref = encode_conditional(sym, idx, tables, **plan)
    got = encode_conditional(cp.asarray(sym), cp.asarray(idx), tables, **plan)
    assert got == ref
    back = decode_conditional(ref, cp.asarray(idx), tables)
    assert isinstance(back, cp.ndarray) and back.dtype == cp.int32 and back.shape == idx.shape
    np.testing.assert_array_equal(back.get(), sym.reshape(idx.shape))
    return ref


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"{p[0]}-{p[1]}")
def test_gpu_bytes_equal_reference(cp, tables, kind, plan):
    for i, n in enumerate(SIZES + (1_000_003,)):
        sym, idx = make_case(kind, n, seed=i)
        check_both_ways(cp, sym, idx, tables, lane_bytes=plan[0], lane_symbols=plan[1])


def test_many_groups_and_all_zero(cp, tables):
    sym, idx = make_case("gaussian", 3_000_001, seed=21)
    buf = check_both_ways(cp, sym, idx, tables)
    assert RL.parse(buf, idx.size, tables.fingerprint).plan.groups > 10
    z = np.zeros(300_000, np.int32)
    check_both_ways(cp, z, z, tables)


@pytest.mark.parametrize("scan_above", [0, 1 << 30])
def test_gather_offsets_from_a_scan_and_from_the_blocks_alike(cp, tables, monkeypatch, scan_above):
    """The encoder's gather places groups by a host-launched scan (many groups) or by each block's own sum of
    the sizes before it (few): the same bytes as the reference either way, with hundreds of groups."""
    monkeypatch.setattr(rans_gpu, "GATHER_SCAN_GROUPS", scan_above)
    sym, idx = make_case("gaussian", 1_000_003, seed=5)
    buf = check_both_ways(cp, sym, idx, tables, lane_bytes=1, lane_symbols=64)
    assert RL.parse(buf, idx.size, tables.fingerprint).plan.groups > 256


@pytest.mark.parametrize("guess", [0, 1, 37])
def test_gpu_encoder_reads_the_rest_when_its_guess_falls_short(cp, tables, monkeypatch, guess):
    """The encoder's one read of sizes and streams stops at ``_read_guess`` bytes; past it, a second copy
    brings the rest: the same bytes as the reference either way."""
    monkeypatch.setattr(rans_gpu, "_read_guess", lambda est, p: guess)
    for kind in KINDS:
        for n in (1, 33, 4097, 100_000):
            sym, idx = make_case(kind, n, seed=n)
            check_both_ways(cp, sym, idx, tables, lane_bytes=8, lane_symbols=64)


def test_golden_streams_on_the_gpu(cp):
    """Every version's golden streams decode on the GPU; today's version encodes there to the same bytes."""
    sym, idx, tables = golden_inputs()
    from .rans_cases import GOLDEN

    for version in RL.VERSIONS:
        for name, plan in GOLDEN_PLANS.items():
            stored = (GOLDEN / f"{name}_v{version}.vzrc").read_bytes()
            np.testing.assert_array_equal(decode_conditional(stored, cp.asarray(idx), tables).get(), sym)
            if version >= RL.VERSION:
                assert encode_conditional(cp.asarray(sym), cp.asarray(idx), tables, skip_freq=GOLDEN_SKIP[version],
                                          **plan) == stored


def test_torch_cuda_tensors(cp, tables):
    import torch

    sym, idx = make_case("escapes", 50_000, seed=22)
    ref = encode_conditional(sym, idx, tables)
    t_sym = torch.from_numpy(sym).cuda().reshape(2, 25_000)
    t_idx = torch.from_numpy(idx).cuda().reshape(2, 25_000)
    assert encode_conditional(t_sym, t_idx, tables) == ref
    np.testing.assert_array_equal(decode_conditional(ref, t_idx, tables).get().reshape(-1), sym)


def test_tensors_written_on_a_side_torch_stream(cp, tables):
    """Tensors written by kernels still queued on a torch stream that is not cupy's: the coder waits for them
    (cupy runs on torch's current stream), so the bytes and the decoded values are the reference's."""
    import torch

    sym, idx = make_case("gaussian", 200_000, seed=23)
    ref = encode_conditional(sym, idx, tables)
    src_sym, src_idx = torch.from_numpy(sym).cuda(), torch.from_numpy(idx).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # the copies below wait behind this kernel, with no host sync
        t_sym, t_idx = src_sym + 0, src_idx + 0
        got = encode_conditional(t_sym, t_idx, tables)
        torch.cuda._sleep(200_000_000)
        t_idx2 = src_idx + 0
        back = torch.as_tensor(decode_conditional(ref, t_idx2, tables), device="cuda") + 0
    side.synchronize()
    assert got == ref
    np.testing.assert_array_equal(back.cpu().numpy(), sym)


def test_cupy_follows_torchs_current_stream(cp):
    """``cuda.torch_stream`` (the collectives') and ``cuda.after_torch`` given a CUDA tensor (the coders') make
    torch's current stream cupy's for the block, and give cupy's own back after it."""
    import torch

    from visemz import cuda

    before = cp.cuda.get_current_stream().ptr
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with cuda.torch_stream() as got:
            assert got is cp and cp.cuda.get_current_stream().ptr == side.cuda_stream
        with cuda.after_torch(np.zeros(1), torch.zeros(1, device="cuda")):
            assert cp.cuda.get_current_stream().ptr == side.cuda_stream
        with cuda.after_torch(cp.zeros(1)):  # cupy arrays: cupy's stream as it was
            assert cp.cuda.get_current_stream().ptr == before
    assert cp.cuda.get_current_stream().ptr == before


def test_bad_indexes_on_the_gpu(cp, tables):
    with pytest.raises(InvalidArgumentError, match="0..63"):
        encode_conditional(cp.zeros(3, cp.int32), cp.asarray([0, 64, 1], cp.int32), tables)
    buf = encode_conditional(np.zeros(3, np.int32), np.zeros(3, np.int32), tables)
    with pytest.raises(InvalidArgumentError, match="0..63"):
        decode_conditional(buf, cp.asarray([0, -1, 0], cp.int32), tables)
    # the decoder reads the range check with its status (one host read): a bad index is still reported
    # first, before a damaged stream, and a bad index among many valid ones is caught like on the CPU
    for stream in (buf[:-1], buf[:5]):
        for device_idx in (cp.asarray([0, 64, 0], cp.int32), np.asarray([0, 64, 0], np.int32)):
            with pytest.raises(InvalidArgumentError, match="0..63"):
                decode_conditional(stream, device_idx, tables)
    sym, idx = make_case("escapes", 5000, seed=24)
    buf = encode_conditional(sym, idx, tables)
    for pos, value in ((0, -5), (4321, 64), (4999, 2**31 - 1)):
        wrong = idx.astype(np.int32).copy()
        wrong[pos] = value
        for device_idx in (cp.asarray(wrong), wrong):
            with pytest.raises(InvalidArgumentError, match="0..63"):
                decode_conditional(buf, device_idx, tables)
    np.testing.assert_array_equal(decode_conditional(buf, cp.asarray(idx), tables).get(), sym.astype(np.int32))


def test_gpu_decoder_catches_what_the_cpu_decoder_catches(cp, tables):
    """Damaged lane data behind a recomputed checksum: the GPU raises exactly where the CPU does."""
    sym, idx = make_case("gaussian", 2000, seed=23)
    buf = encode_conditional(sym, idx, tables, lane_bytes=8, lane_symbols=64)
    parsed = RL.parse(buf, idx.size, tables.fingerprint)
    body = bytearray(buf[RL.HEAD2 :])
    rng = np.random.default_rng(5)
    first, last = int(parsed.starts[0]) - RL.HEAD2, int((parsed.starts + parsed.sizes)[-1]) - RL.HEAD2
    gidx = cp.asarray(idx)
    for i in range(first, last, 3):
        old = body[i]
        body[i] = (old + int(rng.integers(1, 256))) % 256
        bad = with_body(buf, bytes(body))
        try:
            cpu = decode_conditional(bad, idx, tables)
        except CorruptStreamError:
            with pytest.raises(CorruptStreamError):
                decode_conditional(bad, gidx, tables)
        else:
            np.testing.assert_array_equal(decode_conditional(bad, gidx, tables).get(), cpu)
        body[i] = old
    for cut in range(0, len(buf), 7):
        with pytest.raises(VisemzError):
            decode_conditional(buf[:cut], gidx, tables)


def test_frequency_one_symbols(cp):
    """Symbols of frequency 1 (the encoder's special case of its reciprocal) in every position of a lane."""
    from visemz.encoders.cdf_tables import CdfTables

    cdf = np.concatenate([np.arange(101), [65535, 65536]])  # values 0..99: frequency 1; 100: the rest; escape: 1
    t = CdfTables(cdf.astype(np.int32), np.array([0, cdf.size], np.int32), np.zeros(1, np.int32))
    rng = np.random.default_rng(7)
    for n in (1, 32, 1000, 50_000):
        sym = np.where(rng.random(n) < 0.3, rng.integers(0, 100, n), 100).astype(np.int32)
        sym[rng.random(n) < 0.01] = 5000  # escapes
        check_both_ways(cp, sym, np.zeros(n, np.int32), t)
        check_both_ways(cp, sym, np.zeros(n, np.int32), t, lane_bytes=8, lane_symbols=64)


@pytest.mark.parametrize("kind", KINDS)
def test_skipping_streams_are_the_same_bytes_on_the_gpu(cp, tables, kind):
    """Version 3 (skipped symbols gathered and listed by cupy as the reference does with NumPy): the same
    bytes as the reference, decoded both ways, for every threshold, plan and size."""
    for i, n in enumerate(SIZES + (300_001,)):
        sym, idx = make_case(kind, n, seed=60 + i)
        for freq in SKIPS:
            for plan in PLANS:
                check_both_ways(cp, sym, idx, tables, lane_bytes=plan[0], lane_symbols=plan[1], skip_freq=freq)


def test_gpu_refuses_skip_streams_inconsistent_with_their_indexes(cp, tables):
    """What the CPU decoder refuses of a version-3 stream, the GPU decoder refuses: bad indexes first, then
    counts and exceptions that disagree with the indexes."""
    sym, idx = make_case("escapes", 400, seed=21)
    idx[:200] = 0
    sym[[3, 150]] = [2, -1]
    buf = encode_conditional(sym, idx, tables, lane_bytes=8, lane_symbols=64, skip_freq=65531)
    skip = RL.parse(buf, idx.size, tables.fingerprint).skip
    coded = np.flatnonzero(tables.zero_freq[idx] < 65531)
    bad = [reframe3(buf, freq=65533), reframe3(buf, exceptions=skip.positions.size - 1),
           reframe3(buf, positions=np.sort(np.r_[skip.positions[:-1], coded[-1]]))]
    for stream in bad:
        with pytest.raises(CorruptStreamError):
            decode_conditional(stream, idx, tables)
        with pytest.raises(CorruptStreamError):
            decode_conditional(stream, cp.asarray(idx), tables)
    wrong = idx.copy()
    wrong[0] = 40
    with pytest.raises(CorruptStreamError):
        decode_conditional(buf, cp.asarray(wrong), tables)
    wrong[0] = 64  # a bad index is reported first, before the count its stand-in would upset, as on the CPU
    for stream in (buf, buf[:-1], reframe3(buf, freq=65533)):
        for device_idx in (cp.asarray(wrong), wrong):
            with pytest.raises(InvalidArgumentError, match="0..63"):
                decode_conditional(stream, device_idx, tables)
    with pytest.raises(InvalidArgumentError, match="0..63"):
        encode_conditional(cp.asarray(sym), cp.asarray(wrong), tables, skip_freq=65531)
    np.testing.assert_array_equal(decode_conditional(buf, cp.asarray(idx), tables).get(), sym)


def test_wide_indexes_are_checked_before_the_int32_cast(cp, tables):
    """An int64 or uint32 index of 2**32 + k would wrap to k in int32: refused on the GPU as on the CPU."""
    sym, idx = make_case("gaussian", 1000, seed=3)
    buf = encode_conditional(sym, idx, tables)
    for dtype in (np.int64, np.uint32, np.uint64):
        wide = idx.astype(dtype)
        wide[10] = np.array(2**32 + 1).astype(dtype) if dtype != np.uint32 else np.uint32(2**32 - 1)
        for device_idx in (wide, cp.asarray(wide)):
            with pytest.raises(InvalidArgumentError, match="0..63"):
                decode_conditional(buf, device_idx, tables)
            with pytest.raises(InvalidArgumentError, match="0..63"):
                encode_conditional(sym, device_idx, tables)
        np.testing.assert_array_equal(decode_conditional(buf, cp.asarray(idx.astype(dtype)), tables).get(), sym)


def test_torch_cuda_tensors_with_skipped_symbols(cp, tables):
    """The codec hands its sections to the coder as torch CUDA tensors: version 3 from them is the reference's."""
    import torch

    sym, idx = make_case("escapes", 50_000, seed=25)
    idx[::3] = 0  # the narrowest table: skipped
    ref = encode_conditional(sym, idx, tables, skip_freq=65531)
    t_sym = torch.from_numpy(sym).cuda().reshape(2, 25_000)
    t_idx = torch.from_numpy(idx).cuda().reshape(2, 25_000)
    assert encode_conditional(t_sym, t_idx, tables, skip_freq=65531) == ref
    np.testing.assert_array_equal(decode_conditional(ref, t_idx, tables).get().reshape(-1), sym)
