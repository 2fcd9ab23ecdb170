"""Image format 10: a sparse lossless tile coded as its neighbours' differences under a table of their own, where
that is smaller than the residual prior's coding (resampled data stretched from fewer levels); on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage import data

import visemz
from visemz import container
from visemz.errors import CorruptStreamError
from visemz.image import codec as codec_module
from visemz.image import differences as D
from visemz.image import image_header
from visemz.image.pixels import describe

from .helpers import max_abs_error, resampled, with_tile_part

pytestmark = pytest.mark.usefixtures("model_weights")


def _tile_sections(buf) -> dict:
    return codec_module.ImageCodec("cpu")._open(buf).tile(0)[0]


def _residual_sections(buf) -> dict:
    names = set(container.unpack(buf).meta["tiles"]["parts"]) - {"y", "z"}
    return {k: bytes(v) for k, v in _tile_sections(buf).items() if k in names}


@pytest.mark.parametrize("kind", D.KINDS)
@pytest.mark.parametrize("shape", [(1, 1, 5, 7), (2, 1, 1, 9), (1, 3, 8, 1), (1, 3, 6, 6)])
def test_differences_are_undone_exactly(kind, shape):
    x = torch.from_numpy(np.random.default_rng(kind).integers(0, 65536, shape))
    d = D.differences(x, kind)
    assert torch.equal(D.undone(d, kind), x)
    assert torch.equal(d[..., 0, 0], x[..., 0, 0])  # the first pixel is kept as it is


def test_each_kind_is_the_neighbour_it_names():
    x = torch.tensor([[[[1, 4, 9], [16, 25, 36]]]])
    assert D.differences(x, D.ROWS).tolist() == [[[[1, 4, 9], [15, 21, 27]]]]
    assert D.differences(x, D.COLUMNS).tolist() == [[[[1, 3, 5], [16, 9, 11]]]]
    assert D.differences(x, D.BOTH).tolist() == [[[[1, 3, 5], [15, 6, 6]]]]


@pytest.mark.parametrize("image", [
    lambda: resampled(),
    lambda: data.camera()[:30, :41],
    lambda: data.astronaut()[:17, :23],  # RGB: the planes' differences under one table
    lambda: np.full((9, 11), 4000, np.uint16),  # one value
])
def test_tiles_decode_to_their_pixels(image):
    img = np.ascontiguousarray(image())
    x = torch.from_numpy(img.astype(np.int32) if img.dtype == np.uint16 else img)
    meta = describe(torch.from_numpy(img))
    out = D.decode(D.encode(x, meta), meta, "cpu")
    assert out.dtype == (torch.uint16 if img.dtype == np.uint16 else torch.uint8)
    np.testing.assert_array_equal(out.to(torch.int32).numpy(), img)


@pytest.mark.parametrize("kind", D.KINDS)
def test_every_kind_decodes(monkeypatch, kind):
    monkeypatch.setattr(D, "KINDS", (kind,))
    img = resampled()
    meta = describe(torch.from_numpy(img))
    sections = D.encode(torch.from_numpy(img.astype(np.int32)), meta)
    assert D._unpack_table(sections[D.TABLE])[0] == kind
    np.testing.assert_array_equal(D.decode(sections, meta, "cpu").to(torch.int32).numpy(), img)


def test_the_kind_with_the_fewest_bits_is_taken():
    i, j = np.indices((30, 20))
    rows = np.random.default_rng(3).integers(0, 65536, 30)[:, None].repeat(20, 1)  # each row one value
    plane = 1000 + 37 * i + 301 * j
    for img, kinds in ((rows, {D.COLUMNS, D.BOTH}), (rows.T, {D.ROWS, D.BOTH}), (plane, {D.BOTH})):
        img = np.ascontiguousarray(img, np.uint16)
        sections = D.encode(torch.from_numpy(img.astype(np.int32)), describe(torch.from_numpy(img)))
        assert D._unpack_table(sections[D.TABLE])[0] in kinds


def test_too_many_distinct_differences_take_no_table(monkeypatch):
    img = resampled()
    monkeypatch.setattr(D, "MAX_VALUES", 3)
    assert D.encode(torch.from_numpy(img.astype(np.int32)), describe(torch.from_numpy(img))) is None
    buf = visemz.compress(img, max_error=0, quality=2)  # the prior's coding, then
    assert _residual_sections(buf)[D.DIFFS] == b""
    np.testing.assert_array_equal(visemz.decompress(buf), img)


def test_resampled_stretched_data_is_coded_as_differences():
    img = resampled()
    codec = codec_module.ImageCodec("cpu")
    buf = codec.compress(img, max_error=0, quality=2)
    assert container.unpack(buf).meta["format"] == image_header.DIFFERENCES == codec_module.FORMAT
    sections = _residual_sections(buf)
    assert sections[D.DIFFS] and sections[D.TABLE]
    assert all(not v for k, v in sections.items() if k not in D.SECTIONS)  # the prior's are empty
    np.testing.assert_array_equal(codec.decompress(buf), img)
    np.testing.assert_array_equal(codec.decompress(buf, region=(3, 17, 5, 30)), img[3:17, 5:30])
    by_prior = codec.compress(img, max_error=0, quality=2, image_format=image_header.CALIBRATED)
    assert len(buf) < 0.95 * len(by_prior)


def test_near_lossless_keeps_the_lossless_differences_file():
    img = resampled()
    chosen, lossless = (visemz.compress(img, max_error=e, quality=2) for e in (2, 0))
    assert chosen == lossless and container.unpack(chosen).meta["max_error"] == 0
    assert _residual_sections(chosen)[D.DIFFS]
    assert max_abs_error(visemz.decompress(chosen), img) == 0
    # the format asked for by its number is the default's file
    assert codec_module.ImageCodec("cpu").compress(img, max_error=2, quality=2, image_format=image_header.FORMAT) \
        == chosen


def test_dense_and_near_lossless_tiles_take_no_differences(monkeypatch):
    tried = []
    inner = D.encode
    monkeypatch.setattr(D, "encode", lambda *a: tried.append(a) or inner(*a))
    for img, e in ((data.camera()[:40, :48], 0), (resampled(), 2)):
        monkeypatch.setattr(codec_module, "_sparse_values", lambda t, meta: False)  # the bounded file alone
        buf = visemz.compress(img, max_error=e, quality=2)
        assert _residual_sections(buf)[D.DIFFS] == b"" and max_abs_error(visemz.decompress(buf), img) <= e
    assert tried == []


def test_earlier_formats_hold_no_differences():
    img = resampled()
    codec = codec_module.ImageCodec("cpu")
    for fmt in (image_header.CALIBRATED, image_header.INTEGER):
        buf = codec.compress(img, max_error=0, quality=2, image_format=fmt)
        assert not set(D.SECTIONS) & set(container.unpack(buf).meta["tiles"]["parts"])
        np.testing.assert_array_equal(codec.decompress(buf), img)


def _table(values, freqs, kind=D.BOTH) -> bytes:
    v = np.asarray(values, np.int64)
    return D.encode_ints(np.concatenate([[kind, v[0]], np.diff(v), freqs]).astype(np.int32), policy="block",
                         entropy="zstd")


def test_crafted_differences_are_refused():
    img = resampled()
    buf = visemz.compress(img, max_error=0, quality=2)
    kind, values, freqs = D._unpack_table(_residual_sections(buf)[D.TABLE])
    v = values.tolist()
    bad_tables = [
        _table(v, freqs, kind=4),  # no such kind
        _table(v[:2][::-1] + v[2:], freqs),  # not increasing
        _table(v, np.r_[freqs[:-1], 0]),  # a frequency of 0
        _table(v, np.r_[freqs[:-1], freqs[-1] + 65536 - freqs.sum()]),  # no room for the escape
        D.encode_ints(np.array([kind, 5, 1, 2], np.int32), policy="block", entropy="zstd"),  # a value short
        _table(v[:-1], freqs[:-1]),  # a table the stream was not coded with
    ]
    for body in bad_tables:
        with pytest.raises(CorruptStreamError):
            visemz.decompress(with_tile_part(buf, D.TABLE, body))
    for name in (D.TABLE, D.DIFFS):  # one without the other
        with pytest.raises(CorruptStreamError, match="differences"):
            visemz.decompress(with_tile_part(buf, name, b""))
    prior_coded = visemz.compress(data.camera()[:40, :48], max_error=0, quality=2)
    with pytest.raises(CorruptStreamError, match="no other residual section"):  # beside the prior's sections
        visemz.decompress(with_tile_part(with_tile_part(prior_coded, D.TABLE, _residual_sections(buf)[D.TABLE]),
                                         D.DIFFS, _residual_sections(buf)[D.DIFFS]))
    near = visemz.compress(data.camera()[:40, :48], max_error=2, quality=2)  # differences where the bound is not 0
    sections = _residual_sections(near)
    crafted = near
    for name in [n for n in sections if n not in D.SECTIONS]:
        crafted = with_tile_part(crafted, name, b"")
    crafted = with_tile_part(with_tile_part(crafted, D.TABLE, _residual_sections(buf)[D.TABLE]), D.DIFFS,
                             _residual_sections(buf)[D.DIFFS])
    with pytest.raises(CorruptStreamError, match="max_error 2"):
        visemz.decompress(crafted)


def test_stream_beyond_its_table_or_range_is_refused():
    img = resampled()
    meta = describe(torch.from_numpy(img))
    n = img.size
    # an index coded under the escape (a value the table does not list), and values whose sums leave 0..65535
    freqs = np.array([40000, 25000])
    tables = D._tables(freqs)
    escaped = D.encode_conditional(np.r_[np.zeros(n - 1), 7].astype(np.int32), np.zeros(n, np.int32), tables)
    with pytest.raises(CorruptStreamError, match="beyond its table"):
        D.decode({D.TABLE: _table([0, 1], freqs), D.DIFFS: escaped}, meta, "cpu")
    ones = D.encode_conditional(np.ones(n, np.int32), np.zeros(n, np.int32), tables)
    with pytest.raises(CorruptStreamError, match="outside the image's range"):
        D.decode({D.TABLE: _table([0, 60000], freqs), D.DIFFS: ones}, meta, "cpu")
