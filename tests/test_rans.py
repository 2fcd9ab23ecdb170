"""Conditional rANS on the CPU: round trips, rate, a golden stream, and damaged streams."""

import struct
import tracemalloc

import numpy as np
import pytest

from visemz import defaults
from visemz.encoders import rans_gpu
from visemz.encoders import rans_layout as RL
from visemz.encoders.cdf_tables import COST_UNIT
from visemz.encoders.rans import decode_conditional, encode_conditional, prepare
from visemz.errors import (
    CorruptStreamError,
    InvalidArgumentError,
    LimitExceededError,
    UnsupportedFormatError,
    VisemzError,
)
from visemz.framing import read_varints, write_varints

from .helpers import damaged_copies
from .rans_cases import GOLDEN, KINDS, PLANS, SIZES, ideal_bits, make_case

MAX_PEAK = 64 << 20


def roundtrip(sym, idx, tables, **plan):
    buf = encode_conditional(sym, idx, tables, **plan)
    out = decode_conditional(buf, idx, tables)
    assert out.dtype == np.int32 and out.shape == idx.shape
    np.testing.assert_array_equal(out, sym.reshape(idx.shape))
    return buf


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"{p[0]}-{p[1]}")
def test_roundtrip(tables, kind, plan):
    for i, n in enumerate(SIZES):
        sym, idx = make_case(kind, n, seed=i)
        roundtrip(sym, idx, tables, lane_bytes=plan[0], lane_symbols=plan[1])


def plan_of(buf, n: int, tables) -> RL.Plan:
    return RL.parse(buf, n, tables.fingerprint).plan


def test_all_zero_with_the_narrowest_table_costs_only_the_lane_states(tables):
    for n in (1, 20_001, 300_000):
        buf = roundtrip(np.zeros(n, np.int32), np.zeros(n, np.int32), tables)
        pieces = RL.pieces(buf)
        assert pieces["body"] <= 1 and pieces["escapes"] == 0 and pieces["header"] <= RL.HEAD2 + 10, (n, pieces)
        assert pieces["lane_states"] == 4 * plan_of(buf, n, tables).lanes


def test_plans_cover_one_lane_to_many_groups(tables):
    sym, idx = make_case("gaussian", 20_001, seed=3)
    seen = set()
    for lane_bytes, lane_symbols in ((10**9, RL.MAX_LANE_SYMBOLS), (10**9, 1000), (8, 64), (1, 64)):
        buf = roundtrip(sym, idx, tables, lane_bytes=lane_bytes, lane_symbols=lane_symbols)
        p = plan_of(buf, idx.size, tables)
        seen.add((p.lanes, p.groups))
    assert (1, 1) in seen and any(g > 1 for _, g in seen) and any(1 < k < 32 for k, _ in seen)


def test_shapes_dtypes_and_tables_of_every_index(tables):
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 64, (2, 3, 5, 7)).astype(np.uint8)
    sym = rng.integers(-3, 4, idx.shape).astype(np.int16)
    roundtrip(sym, idx, tables)
    idx = np.arange(64, dtype=np.int32).repeat(40)  # every table, including the widest (scale 256)
    sym = np.round(np.random.default_rng(2).normal(0, 1, idx.size) * 256).astype(np.int32)
    roundtrip(sym, idx, tables)


def test_bad_arguments_name_the_value(tables):
    with pytest.raises(InvalidArgumentError, match="0..63"):
        encode_conditional(np.zeros(3, np.int32), np.array([0, 64, 1]), tables)
    with pytest.raises(InvalidArgumentError, match="0..63"):
        encode_conditional(np.zeros(3, np.int32), np.array([0, -1, 1]), tables)
    with pytest.raises(InvalidArgumentError, match="3 symbols but 2"):
        encode_conditional(np.zeros(3, np.int32), np.zeros(2, np.int32), tables)
    with pytest.raises(UnsupportedFormatError, match="int64"):
        encode_conditional(np.zeros(3, np.int64), np.zeros(3, np.int32), tables)
    with pytest.raises(InvalidArgumentError, match="float"):
        encode_conditional(np.zeros(3, np.int32), np.zeros(3, np.float32), tables)
    with pytest.raises(InvalidArgumentError, match="lane_bytes=0"):
        encode_conditional(np.zeros(3, np.int32), np.zeros(3, np.int32), tables, lane_bytes=0)
    with pytest.raises(InvalidArgumentError, match="lane_symbols=2000000"):
        encode_conditional(np.zeros(3, np.int32), np.zeros(3, np.int32), tables, lane_symbols=2_000_000)
    buf = encode_conditional(np.zeros(3, np.int32), np.zeros(3, np.int32), tables)
    with pytest.raises(InvalidArgumentError, match="0..63"):
        decode_conditional(buf, np.array([0, 99, 0]), tables)


# ---------------------------------------------------------------- rate
def gaussian_code_bits(sym, scales):
    """-sum log2 of each symbol's probability under its continuous Gaussian (integrated over the bin)."""
    from scipy import special

    phi = lambda x: 0.5 * special.erfc(-x / np.sqrt(2))
    v = np.abs(sym.astype(np.float64))
    return float(-np.log2(phi((0.5 - v) / scales) - phi((-0.5 - v) / scales)).sum())


def test_rate_is_within_one_percent_of_the_gaussian_ideal(tables):
    from visemz.encoders.cdf_tables import default_scale_table

    rng = np.random.default_rng(7)
    table = default_scale_table()
    idx = rng.integers(8, 40, 200_000).astype(np.int32)  # scales 0.3 .. 10
    sym = np.round(rng.normal(0, 1, idx.size) * table[idx]).astype(np.int32)
    nbytes = len(encode_conditional(sym, idx, tables))
    ideal = gaussian_code_bits(sym, table[idx]) / 8
    quantised = ideal_bits(sym, idx, tables) / 8
    assert ideal <= quantised <= 1.001 * ideal  # the integer tables lose almost nothing
    assert ideal < nbytes <= 1.01 * ideal, (nbytes, ideal)


def test_rate_matches_compressai_rans_on_the_same_symbols_and_indexes():
    import torch
    from compressai import ans
    from compressai.entropy_models import GaussianConditional
    from compressai.models.google import get_scale_table

    from visemz.encoders.cdf_tables import gaussian_scale_tables

    gc = GaussianConditional(None)
    gc.update_scale_table(get_scale_table())
    ours = gaussian_scale_tables(gc.scale_table.double().numpy())
    rng = np.random.default_rng(8)
    scales = np.exp(rng.uniform(np.log(0.05), np.log(30), 150_000))
    idx = gc.build_indexes(torch.from_numpy(scales).float()).int().numpy()
    sym = np.round(rng.normal(0, 1, scales.size) * scales).astype(np.int32)
    enc = ans.BufferedRansEncoder()
    enc.encode_with_indexes(sym.tolist(), idx.tolist(), gc.quantized_cdf.tolist(),
                            gc.cdf_length.reshape(-1).int().tolist(), gc.offset.reshape(-1).int().tolist())
    theirs = len(enc.flush())
    buf = roundtrip(sym, idx, ours)
    assert len(buf) <= 1.01 * theirs, (len(buf), theirs)


# ---------------------------------------------------------------- golden
def golden_inputs():
    d = np.load(GOLDEN / "golden_v1.npz", allow_pickle=False)
    from visemz.encoders.cdf_tables import CdfTables

    return d["symbols"].astype(np.int32), d["indexes"].astype(np.int32), CdfTables.from_dict(d)


GOLDEN_PLANS = {"one_group": {}, "groups": {"lane_bytes": 1, "lane_symbols": 64}}
# the skip threshold of each version's golden streams: version 3's skips the two narrowest tables (scales 0.11
# and 0.5), whose symbols are not all 0 here, so the stream lists exceptions as well as escapes
GOLDEN_SKIP = {1: 0, 2: 0, 3: 40_000}


@pytest.mark.parametrize("version", RL.VERSIONS)
@pytest.mark.parametrize("name", GOLDEN_PLANS)
def test_golden_stream_still_decodes_and_encodes_the_same(name, version):
    """Every version's golden streams decode; the versions written today (2, and 3 with a skip threshold)
    encode to the same bytes, and versions 1 and 2 differ only in their framing: the lanes' bytes are
    the same."""
    sym, idx, tables = golden_inputs()
    stored = (GOLDEN / f"{name}_v{version}.vzrc").read_bytes()
    np.testing.assert_array_equal(decode_conditional(stored, idx, tables), sym)
    again = encode_conditional(sym, idx, tables, skip_freq=GOLDEN_SKIP[version], **GOLDEN_PLANS[name])
    if version >= RL.VERSION:
        assert again == stored
    if version == RL.VERSION_SKIP:
        skip = RL.parse(stored, idx.size, tables.fingerprint).skip
        assert skip.freq == GOLDEN_SKIP[version] and skip.positions.size > 0
    a, b = RL.parse(stored, idx.size, tables.fingerprint), RL.parse(again, idx.size, tables.fingerprint)
    assert a.plan == b.plan and a.escapes == b.escapes > 0 and list(a.sizes) == list(b.sizes)
    assert bytes(a.buf[int(a.starts[0]):int(a.starts[-1] + a.sizes[-1])]) == \
        bytes(b.buf[int(b.starts[0]):int(b.starts[-1] + b.sizes[-1])])


def write_golden() -> None:  # python -c "from tests.test_rans import write_golden; write_golden()"
    """Small integer tables, symbols with escapes, and the streams the reference writes for them, in today's
    version (a golden stream already there is never rewritten: it is a stream some user has)."""
    from visemz.encoders.cdf_tables import gaussian_scale_tables

    tables = gaussian_scale_tables([0.11, 0.5, 1.3, 4.0, 9.0])
    inputs = GOLDEN / "golden_v1.npz"  # the inputs of every version's streams
    if not inputs.is_file():
        rng = np.random.default_rng(2026)
        idx = rng.integers(0, 5, 2500).astype(np.int8)
        sym = np.round(rng.normal(0, 1.5, idx.size) * np.array([0.11, 0.5, 1.3, 4.0, 9.0])[idx]).astype(np.int16)
        sym[[7, 500, 2499]] = [300, -300, 70]
        GOLDEN.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(inputs, symbols=sym, indexes=idx, **tables.to_dict())
    sym, idx, tables = golden_inputs()
    for version in (RL.VERSION, RL.VERSION_SKIP):
        for name, plan in GOLDEN_PLANS.items():
            path = GOLDEN / f"{name}_v{version}.vzrc"
            if not path.is_file():
                path.write_bytes(encode_conditional(sym, idx, tables, skip_freq=GOLDEN_SKIP[version], **plan))


# ---------------------------------------------------------------- damaged streams
@pytest.fixture(scope="module")
def small(tables):
    sym, idx = make_case("escapes", 300, seed=9)
    return sym, idx, encode_conditional(sym, idx, tables, lane_bytes=8, lane_symbols=64)


def must_fail(buf, idx, tables, error=VisemzError):
    tracemalloc.start()
    try:
        with pytest.raises(error):
            decode_conditional(buf, idx, tables)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK


def reframe1(buf: bytes, **fields) -> bytes:
    """A version-1 stream with header fields rewritten and the checksum recomputed, as a hostile writer could."""
    names = ("magic", "version", "lanes", "reserved", "n", "group_symbols", "escapes", "tables")
    values = dict(zip(names, RL.PREFIX.unpack_from(buf)))
    values.update(fields)
    prefix = RL.PREFIX.pack(*values.values())
    body = buf[RL.HEAD :]
    return prefix + struct.pack("<Q", RL.checksum(prefix, body)) + body


def reframe(buf: bytes, **fields) -> bytes:
    """The same for today's version: fixed fields (magic, version, lanes, tables) and the varint counts
    (n, group_symbols, escapes) rewritten, the rest (group sizes, groups, escapes) kept."""
    values = dict(zip(("magic", "version", "lanes", "tables"), RL.PREFIX2.unpack_from(buf)))
    counts, pos = read_varints(memoryview(buf), RL.HEAD2, 3, "counts")
    values.update(zip(("n", "group_symbols", "escapes"), (int(c) for c in counts)))
    values.update(fields)
    prefix = RL.PREFIX2.pack(*(values[k] for k in ("magic", "version", "lanes", "tables")))
    body = write_varints([values["n"], values["group_symbols"], values["escapes"]]) + buf[pos:]
    return prefix + struct.pack("<Q", RL.checksum(prefix, body)) + body


def with_body(buf: bytes, body: bytes) -> bytes:
    prefix = buf[: RL.PREFIX2.size]
    return prefix + struct.pack("<Q", RL.checksum(prefix, body)) + body


def test_every_truncation_and_extension_is_caught(tables, small):
    _, idx, buf = small
    for cut in range(len(buf)):
        must_fail(buf[:cut], idx, tables)
    must_fail(buf + b"\0", idx, tables, CorruptStreamError)


def test_every_damaged_byte_is_caught(tables, small):
    _, idx, buf = small
    for _, bad in damaged_copies(buf, seed=1):
        with pytest.raises(VisemzError):
            decode_conditional(bad, idx, tables)


def test_damaged_lane_data_behind_a_valid_checksum(tables, small):
    """With the checksum recomputed, the lanes' own checks (final states, byte counts) catch most
    changes.  Not all: a byte that only moves a lane's slot inside a run of frequency-1 symbols
    (far tails) is a valid stream of other symbols; no entropy code can tell, the checksum does."""
    sym, idx, buf = small
    groups = RL.parse(buf, idx.size, tables.fingerprint)
    body = bytearray(buf[RL.HEAD2 :])
    first, last = int(groups.starts[0]) - RL.HEAD2, int((groups.starts + groups.sizes)[-1]) - RL.HEAD2
    rng = np.random.default_rng(4)
    caught = 0
    for i in range(first, last):
        old = body[i]
        body[i] = (old + int(rng.integers(1, 256))) % 256
        try:
            out = decode_conditional(with_body(buf, bytes(body)), idx, tables)
            assert out.shape == idx.shape and not np.array_equal(out, sym)
        except CorruptStreamError:
            caught += 1
        body[i] = old
    assert caught >= 0.9 * (last - first), (caught, last - first)
    np.testing.assert_array_equal(decode_conditional(with_body(buf, bytes(body)), idx, tables), sym)


def test_inconsistent_headers_are_refused(tables, small):
    _, idx, buf = small
    p = plan_of(buf, idx.size, tables)
    for field, value in (("lanes", p.lanes + 1), ("lanes", p.lanes - 1), ("lanes", 33), ("lanes", 0),
                         ("group_symbols", p.group_symbols + 1), ("group_symbols", 0), ("escapes", 0),
                         ("escapes", 5000), ("escapes", 1)):
        must_fail(reframe(buf, **{field: value}), idx, tables, CorruptStreamError)
    must_fail(reframe(buf, n=301), np.zeros(301, np.int32), tables, CorruptStreamError)
    must_fail(buf, idx[:-1], tables, CorruptStreamError)  # other symbol count than the stream's
    must_fail(reframe(buf, tables=0), idx, tables, UnsupportedFormatError)
    must_fail(reframe(buf, version=4), idx, tables, UnsupportedFormatError)
    huge = reframe(buf, n=10**9)
    must_fail(huge, np.zeros(4, np.int32), tables, LimitExceededError)
    long_lane = RL.MAX_STEPS + 1  # one lane of more steps than any encoder makes
    must_fail(reframe(buf, n=long_lane, lanes=1, group_symbols=long_lane), np.zeros(long_lane, np.int8), tables,
              LimitExceededError)
    must_fail(reframe(buf, n=2**64 - 1), idx, tables, LimitExceededError)


def test_version_1_headers_are_still_checked(tables):
    sym, idx, _ = golden_inputs()
    golden_tables = golden_inputs()[2]
    buf = (GOLDEN / "groups_v1.vzrc").read_bytes()
    _, _, lanes, _, _, group_symbols, escapes, _ = RL.PREFIX.unpack_from(buf)
    for field, value in (("lanes", lanes + 1), ("lanes", 33), ("group_symbols", group_symbols + 1),
                         ("escapes", escapes + 1), ("escapes", 0), ("reserved", 1)):
        must_fail(reframe1(buf, **{field: value}), idx, golden_tables, CorruptStreamError)
    must_fail(reframe1(buf, tables=0), idx, golden_tables, UnsupportedFormatError)
    must_fail(reframe1(buf, n=10**9), np.zeros(4, np.int32), golden_tables, LimitExceededError)
    for cut in range(0, len(buf), 7):
        must_fail(buf[:cut], idx, golden_tables)


def test_pieces_of_both_versions_add_up_and_come_from_a_checked_stream(tables):
    sym, idx = make_case("gaussian", 20_001, seed=5)
    for buf in (roundtrip(sym, idx, tables, lane_bytes=1, lane_symbols=64), (GOLDEN / "groups_v1.vzrc").read_bytes()):
        parts = RL.pieces(buf)
        assert sum(parts.values()) == len(buf) and min(parts.values()) >= 0, parts
        assert parts["lane_states"] > 0 and parts["body"] > 0
        with pytest.raises(CorruptStreamError):  # a report never reads a damaged stream
            RL.pieces(buf[:-1])


def test_escape_varints_are_checked(tables, small):
    """The escapes after the groups: exactly E zigzag varints of non-zero int32 excesses, to the end."""
    sym, idx, buf = small
    parsed = RL.parse(buf, idx.size, tables.fingerprint)
    assert parsed.escapes > 2
    end = int(parsed.starts[-1] + parsed.sizes[-1])
    head, excess = buf[RL.HEAD2:end], parsed.escape_stream
    for bad in (RL.escape_varints(excess[:-1]),  # one missing
                RL.escape_varints(excess) + b"\x02",  # one more
                RL.escape_varints(np.concatenate([excess[:-1], [0]])),  # a zero excess
                RL.escape_varints(excess) [:-1] + b"\x80",  # the last one unterminated
                RL.escape_varints(excess[:-1]) + write_varints([1 << 33])):  # beyond int32
        must_fail(with_body(buf, head + bad), idx, tables, CorruptStreamError)
    np.testing.assert_array_equal(decode_conditional(with_body(buf, head + RL.escape_varints(excess)), idx, tables),
                                  sym)


def test_group_sizes_that_do_not_add_up_are_refused(tables):
    sym, idx = make_case("gaussian", 5000, seed=5)
    buf = encode_conditional(sym, idx, tables, lane_bytes=1, lane_symbols=64)
    parsed = RL.parse(buf, idx.size, tables.fingerprint)
    g = parsed.sizes.size
    assert g > 1
    p = parsed.plan
    counts = write_varints([p.n, p.group_symbols, parsed.escapes])
    rest = buf[int(parsed.starts[0]):]
    for delta in ((1, -1), (-1, 1), (1, 0)):
        sizes = parsed.sizes.copy()
        sizes[0] += delta[0]
        sizes[1] += delta[1]
        must_fail(with_body(buf, counts + write_varints(sizes) + rest), idx, tables, CorruptStreamError)
    # a group size written in more bytes than it needs
    first = write_varints(parsed.sizes[:1])
    padded = first[:-1] + bytes([first[-1] | 0x80, 0]) + write_varints(parsed.sizes[1:])
    must_fail(with_body(buf, counts + padded + rest), idx, tables, CorruptStreamError)


def test_wrong_indexes_do_not_decode_to_garbage(tables):
    sym, idx = make_case("gaussian", 3000, seed=6)
    buf = encode_conditional(sym, idx, tables)
    for pos in (0, 1500, 2999):
        wrong = idx.copy()
        wrong[pos] = (wrong[pos] + 9) % 64
        with pytest.raises(CorruptStreamError):
            decode_conditional(buf, wrong, tables)


def test_random_bytes_are_refused(tables):
    rng = np.random.default_rng(12)
    idx = np.zeros(1000, np.int32)
    for size in (0, 5, 17, 18, 19, 31, 32, 40, 1000, 100_000):
        must_fail(rng.integers(0, 256, size, dtype=np.uint8).tobytes(), idx, tables)
    template = encode_conditional(np.zeros(1000, np.int32), idx, tables)
    for size in (4, 100, 5000):  # random bodies behind a valid header and checksum
        must_fail(with_body(template, rng.integers(0, 256, size, dtype=np.uint8).tobytes()), idx, tables)


@pytest.mark.parametrize("kind", KINDS)
def test_gpu_encoders_one_read_covers_the_streams(tables, kind):
    """The GPU encoder reads the groups' sizes and streams in one copy of ``_read_guess`` bytes (a second copy
    when they are longer): the guess, computed from the same integers on the CPU, covers the streams."""
    for lane_bytes, lane_symbols in PLANS:
        lane_bytes = defaults.get("rans_lane_bytes") if lane_bytes is None else lane_bytes
        lane_symbols = defaults.get("rans_lane_symbols") if lane_symbols is None else lane_symbols
        for n in SIZES[1:] + (300_000,):
            sym, idx = make_case(kind, n, seed=n)
            buf = encode_conditional(sym, idx, tables, lane_bytes=lane_bytes, lane_symbols=lane_symbols)
            entry, _ = prepare(sym, idx, tables)
            est = int(tables.cost[entry].sum(dtype=np.int64)) // (8 * COST_UNIT)
            parsed = RL.parse(buf, n, tables.fingerprint)
            assert parsed.plan == RL.plan(n, est, lane_bytes, lane_symbols)
            assert int(parsed.sizes.sum()) <= rans_gpu._read_guess(est, parsed.plan)


# ---------------------------------------------------------------- skipped symbols (version 3)
SKIPS = (65533, 65531, 40_000, 1, 1 << 16)


def coded_mask(idx, tables, freq):
    return tables.zero_freq[idx.reshape(-1)] < freq


@pytest.mark.parametrize("kind", KINDS)
def test_skipping_keeps_only_the_unskipped_symbols_in_the_lanes(tables, kind):
    """Version 3 decodes to the symbols for every threshold; its lanes hold exactly the symbols whose table's
    zero frequency is below it, coded as version 2 codes them alone (same plan, same group bytes), and the
    skipped symbols that are not 0 are listed by position and value."""
    for i, n in enumerate((0, 1, 33, 1000, 20_001)):
        sym, idx = make_case(kind, n, seed=40 + i)
        for freq in SKIPS:
            buf = roundtrip(sym, idx, tables, lane_bytes=8, lane_symbols=64, skip_freq=freq)
            parsed = RL.parse(buf, n, tables.fingerprint)
            m = coded_mask(idx, tables, freq)
            assert buf[4] == RL.VERSION_SKIP and parsed.skip.freq == freq and parsed.plan.n == int(m.sum())
            np.testing.assert_array_equal(parsed.skip.positions, np.flatnonzero(~m & (sym != 0)))
            np.testing.assert_array_equal(parsed.skip.values, sym[parsed.skip.positions])
            alone = RL.parse(encode_conditional(sym[m], idx[m], tables, lane_bytes=8, lane_symbols=64), None, None)
            assert alone.plan == parsed.plan and list(alone.sizes) == list(parsed.sizes)
            if parsed.plan.n:
                assert bytes(alone.buf[int(alone.starts[0]):int(alone.starts[-1] + alone.sizes[-1])]) == \
                    bytes(parsed.buf[int(parsed.starts[0]):int(parsed.starts[-1] + parsed.sizes[-1])])
            parts = RL.pieces(buf)
            assert sum(parts.values()) == len(buf) and min(parts.values()) >= 0, parts
            assert (parts["exceptions"] > 0) == (parsed.skip.positions.size > 0)


def test_skipping_near_certain_zeros_cuts_the_steps_not_the_bytes(tables):
    """Latent-like symbols, most with the narrowest scales: skipping the two narrowest tables removes their
    sequential steps at about the same size (what VISEMZ_RANS_SKIP_FREQ=65531 is for)."""
    rng = np.random.default_rng(3)
    n = 300_000
    idx = np.where(rng.random(n) < 0.75, rng.integers(0, 2, n), rng.integers(0, 64, n)).astype(np.int32)
    from visemz.encoders.cdf_tables import default_scale_table

    sym = np.round(rng.normal(0, 1, n) * default_scale_table()[idx]).astype(np.int32)
    plain = RL.parse(roundtrip(sym, idx, tables), n, tables.fingerprint)
    buf = roundtrip(sym, idx, tables, skip_freq=65531)
    skipping = RL.parse(buf, n, tables.fingerprint)
    assert skipping.plan.steps < 0.5 * plain.plan.steps, (skipping.plan, plain.plan)
    assert len(buf) <= 1.005 * len(plain.buf), (len(buf), len(plain.buf))


def test_skip_threshold_is_checked_by_name(tables, monkeypatch):
    from visemz import config

    sym, idx = make_case("gaussian", 100, seed=1)
    for bad in (-1, (1 << 16) + 1, 1.5, True, "65531"):
        with pytest.raises(InvalidArgumentError, match="skip_freq"):
            encode_conditional(sym, idx, tables, skip_freq=bad)
    monkeypatch.setenv("VISEMZ_RANS_SKIP_FREQ", "65531")
    assert config.from_env().rans_skip_freq == 65531
    for bad in ("-1", "65537"):
        monkeypatch.setenv("VISEMZ_RANS_SKIP_FREQ", bad)
        with pytest.raises(InvalidArgumentError, match="VISEMZ_RANS_SKIP_FREQ"):
            config.from_env()


def reframe3(buf: bytes, *, positions=None, values=None, **counts) -> bytes:
    """A version-3 stream with its counts (total, freq, n, group_symbols, escapes, exceptions) or its exception
    list rewritten, the checksum recomputed, as a hostile writer could."""
    mv = memoryview(buf)
    names = ("total", "freq", "n", "group_symbols", "escapes", "exceptions")
    head, pos = read_varints(mv, RL.HEAD2, 6, "counts")
    fields = dict(zip(names, (int(v) for v in head)))
    parsed = RL.parse(buf, None, None)
    listed = RL.exception_varints(parsed.skip.positions, parsed.skip.values)
    middle = buf[pos : len(buf) - len(listed)]
    if positions is not None or values is not None:
        listed = RL.exception_varints(parsed.skip.positions if positions is None else positions,
                                      parsed.skip.values if values is None else values)
    fields.update(counts)
    return with_body(buf, write_varints([fields[k] for k in names]) + middle + listed)


@pytest.fixture(scope="module")
def skipping(tables):
    sym, idx = make_case("escapes", 400, seed=21)
    idx[:200] = 0  # the narrowest table: skipped, with a few non-zero symbols among them
    sym[[3, 150]] = [2, -1]
    buf = encode_conditional(sym, idx, tables, lane_bytes=8, lane_symbols=64, skip_freq=65531)
    parsed = RL.parse(buf, idx.size, tables.fingerprint)
    assert parsed.skip.positions.size >= 2 and parsed.escapes > 0
    return sym, idx, buf


def test_skip_streams_inconsistent_with_their_indexes_are_refused(tables, skipping):
    """A version-3 stream whose counts, exceptions or indexes disagree is refused, never decoded into garbage."""
    sym, idx, buf = skipping
    np.testing.assert_array_equal(decode_conditional(reframe3(buf), idx, tables), sym)  # the helper changes nothing
    parsed = RL.parse(buf, idx.size, tables.fingerprint)
    skip, p = parsed.skip, parsed.plan
    for counts in ({"freq": 0}, {"freq": (1 << 16) + 1}, {"n": p.n + 1}, {"n": p.n - 1}, {"total": 401},
                   {"n": 401}, {"exceptions": skip.positions.size + 1}, {"exceptions": skip.positions.size - 1},
                   {"exceptions": 400 - p.n + 1}, {"freq": 65533}, {"freq": 65511}):
        must_fail(reframe3(buf, **counts), idx, tables, CorruptStreamError)
    coded = np.flatnonzero(coded_mask(idx, tables, 65531))
    for positions, values in ((np.r_[skip.positions[:-1], 400], None),  # beyond the symbols
                              (np.r_[skip.positions[:-1], coded[-1]], None),  # a position whose symbol is coded
                              (None, np.r_[skip.values[:-1], 0])):  # a zero value
        positions = skip.positions if positions is None else np.sort(positions)
        must_fail(reframe3(buf, positions=positions, values=values), idx, tables, CorruptStreamError)
    wrong = idx.copy()
    wrong[0] = 40  # a skipped symbol's table made wide: the indexes leave one more symbol coded
    must_fail(buf, wrong, tables, CorruptStreamError)
    wrong = idx.copy()
    wrong[coded[0]] = 0  # a coded symbol's table made the narrowest: one fewer coded
    must_fail(buf, wrong, tables, CorruptStreamError)
    listed = RL.exception_varints(skip.positions, skip.values)
    head = buf[RL.HEAD2 : len(buf) - len(listed)]
    for tail in (listed[:-1], listed + b"\x02", listed[:-1] + b"\x80",  # a value short, one more, unterminated
                 write_varints(np.diff(skip.positions, prepend=-1) - 1) + RL.escape_varints(skip.values[:-1])
                 + write_varints([1 << 33])):  # a value beyond int32
        must_fail(with_body(buf, head + tail), idx, tables, CorruptStreamError)
    gap = write_varints([int(skip.positions[0])])  # the first position written in 6 bytes (at most 5)
    long_gap = bytes(b | 0x80 for b in gap) + b"\x80" * (5 - len(gap)) + b"\x00"
    must_fail(with_body(buf, head + long_gap + listed[len(gap):]), idx, tables, CorruptStreamError)


def test_version_3_edge_counts_are_refused(tables):
    """All symbols skipped (n = 0) with lanes or a group size claimed, no symbols with an exception, and gaps
    whose sum would wrap: refused behind a valid checksum."""
    idx = np.zeros(50, np.int32)  # every symbol skipped at 65531
    sym = np.zeros(50, np.int32)
    sym[[4, 40]] = [3, -2]
    buf = roundtrip(sym, idx, tables, skip_freq=65531)
    parsed = RL.parse(buf, idx.size, tables.fingerprint)
    assert parsed.plan.n == 0 and list(parsed.skip.positions) == [4, 40]
    listed = RL.exception_varints(parsed.skip.positions, parsed.skip.values)
    for counts in ([50, 65531, 0, 1, 0, 2], [50, 65531, 0, 0, 1, 2]):  # C or E non-zero without coded symbols
        must_fail(with_body(buf, write_varints(counts) + listed), idx, tables, CorruptStreamError)
    must_fail(with_body(buf, write_varints([50, 65531, 0, 0, 0, 2]) + b"\x01" + listed), idx, tables,
              CorruptStreamError)  # a stray byte before the exceptions
    prefix = RL.PREFIX2.pack(RL.MAGIC, RL.VERSION_SKIP, 1, tables.fingerprint & 0xFFFFFFFF)  # K = 1 without lanes
    body = buf[RL.HEAD2 :]
    must_fail(prefix + struct.pack("<Q", RL.checksum(prefix, body)) + body, idx, tables, CorruptStreamError)
    empty = np.zeros(0, np.int32)
    must_fail(with_body(buf, write_varints([0, 65531, 0, 0, 0, 1]) + write_varints([0]) + RL.escape_varints([1])),
              empty, tables, CorruptStreamError)  # an exception among no symbols
    wrap = write_varints([(1 << 35) - 1] * 3) + RL.escape_varints([1, 1, 1])  # gaps whose int64 sum could wrap
    must_fail(with_body(buf, write_varints([50, 65531, 0, 0, 0, 3]) + wrap), idx, tables, CorruptStreamError)
