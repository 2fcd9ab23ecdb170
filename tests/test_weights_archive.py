"""The weights archive: older weights files kept by id as zstd frames, checked when read, and the residual priors a
file names loaded from it after an update (the installed prior then has another id)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import zstandard
from safetensors.torch import save_file

from visemz import container
from visemz.errors import UnsupportedFormatError
from visemz.image.codec import ImageCodec
from visemz.models import architectures, registry, residual_weights
from visemz.models import weights as W
from visemz.models.residual_prior import ResidualPrior


@pytest.fixture
def weights_folder(model_weights, tmp_path, monkeypatch):
    """A weights folder of links to the test weights (the archive's files linked into an archive folder of its own,
    so that nothing is written beside the package's files)."""
    folder = tmp_path / "weights"
    (folder / W.ARCHIVE).mkdir(parents=True)
    for f in model_weights.iterdir():
        if f.is_file():
            (folder / f.name).symlink_to(f.resolve())
    for f in (model_weights / W.ARCHIVE).glob("*"):
        (folder / W.ARCHIVE / f.name).symlink_to(f.resolve())
    monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(folder))
    W.load.cache_clear()
    residual_weights.load.cache_clear()
    yield folder
    W.load.cache_clear()
    residual_weights.load.cache_clear()


def _weights_file(path, value: float = 1.0) -> bytes:
    save_file({"w": torch.full((4, 4), value)}, str(path), metadata={"note": "a test"})
    return path.read_bytes()


def test_an_archived_file_reads_back_as_written(weights_folder):
    data = _weights_file(weights_folder / "some.safetensors")
    model_id = W.archive(weights_folder / "some.safetensors")
    assert W.archive_path(model_id).parent == weights_folder / W.ARCHIVE
    assert W.archive_path(model_id).stat().st_size < len(data)
    assert W.read_archived(model_id, "a test") == data
    tensors, meta = W.tensors_of(W.read_archived(model_id, "a test"))
    assert torch.equal(tensors["w"], torch.ones(4, 4)) and meta == {"note": "a test"}


@pytest.mark.parametrize("name", ["mbt2018-mean-gray", "residual-gray"])
def test_damaged_installed_weights_are_refused_by_name(weights_folder, name):
    """An installed weights file cut short (a failed copy, a full disk): UnsupportedFormatError naming it, not the
    safetensors library's own error."""
    path = weights_folder / f"{name}.safetensors"
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[:1000])
    with pytest.raises(UnsupportedFormatError, match=f"{name}.safetensors are not a safetensors file"):
        ImageCodec("cpu").compress(np.zeros((32, 32), np.uint8), max_error=0)


def test_an_archived_file_is_checked_when_read(weights_folder, monkeypatch):
    _weights_file(weights_folder / "a.safetensors")
    model_id = W.archive(weights_folder / "a.safetensors")
    frame = W.archive_path(model_id).read_bytes()
    with pytest.raises(UnsupportedFormatError, match="0123456789abcdef"):
        W.read_archived("0123456789abcdef", "a test")
    other = W.archive_path("0123456789abcdef")
    other.write_bytes(frame)  # the right bytes under another id's name
    with pytest.raises(UnsupportedFormatError, match=f"have the id {model_id}"):
        W.read_archived("0123456789abcdef", "a test")
    damaged = bytearray(frame)
    damaged[len(frame) // 2] ^= 0xFF
    W.archive_path(model_id).write_bytes(bytes(damaged))
    with pytest.raises(UnsupportedFormatError, match=model_id):
        W.read_archived(model_id, "a test")
    W.archive_path(model_id).write_bytes(frame)
    for junk in (b"no weights at all", _weights_file(weights_folder / "b.safetensors")[:-8]):  # tensors cut short
        (weights_folder / "junk.safetensors").write_bytes(junk)
        with pytest.raises(UnsupportedFormatError, match="not a safetensors file"):
            W.tensors_of(W.read_archived(W.archive(weights_folder / "junk.safetensors"), "a test"))
    monkeypatch.setattr(W, "ARCHIVED_MAX", 64)  # a frame declaring more than a weights file may hold
    with pytest.raises(UnsupportedFormatError, match="do not decompress"):
        W.read_archived(model_id, "a test")


def _changed_prior(path, integer: bool) -> None:
    """Replace the prior file at ``path`` (a link) by one whose first head's last bias differs (another id)."""
    tensors, meta = W.read_tensors(path)
    name = f"{residual_weights.PREFIX}heads.0.2.bias"
    tensors[name] = tensors[name] + (1 if integer else 0.01)
    path.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)


@pytest.mark.parametrize("image_format", [9, 10], ids=["integer prior", "float prior"])
def test_a_file_decodes_with_the_archived_prior_it_names(weights_folder, image_format):
    integer = image_format == 9
    rng = np.random.default_rng(5)
    img = (np.add.outer(np.arange(48), np.arange(40)) * 2 + rng.integers(0, 9, (48, 40))).astype(np.uint8)
    codec = ImageCodec("cpu")
    old = codec.compress(img, max_error=0, image_format=image_format)
    old_id = container.unpack(old).meta["residual_id"]
    path = residual_weights.path_of("gray", weights_folder, integer)
    assert W.archive(path) == old_id
    _changed_prior(path, integer)
    residual_weights.load.cache_clear()
    new = codec.compress(img, max_error=0, image_format=image_format)
    new_id = container.unpack(new).meta["residual_id"]
    assert new_id == W.file_id(path) != old_id
    assert np.array_equal(codec.decompress(old), img) and np.array_equal(codec.decompress(new), img)
    W.archive_path(old_id).unlink()
    residual_weights.load.cache_clear()
    with pytest.raises(UnsupportedFormatError, match=old_id):
        codec.decompress(old)


def test_an_archived_file_of_another_kind_is_no_residual_prior(weights_folder):
    """A file naming, as its residual prior, archived weights that are a lossy model's or the other variant's prior."""
    rgb = W.archive(residual_weights.path_of("rgb", weights_folder))
    with pytest.raises(UnsupportedFormatError, match="not of gray images"):
        residual_weights.load("gray", "cpu", False, rgb)
    lossy = W.archive(weights_folder / "balle2016-gray.safetensors")
    with pytest.raises(UnsupportedFormatError, match="not readable"):
        residual_weights.load("gray", "cpu", False, lossy)
    gray_int8 = W.archive(residual_weights.path_of("gray", weights_folder, integer=True))
    with pytest.raises(UnsupportedFormatError, match="not readable"):  # the integer prior named as a float one
        residual_weights.load("gray", "cpu", False, gray_int8)


def test_a_saved_prior_archives_the_one_it_replaces(tmp_path):
    card = {"lossy_model": "mbt2018-mean-gray", "lossy_model_id": "0123456789abcdef"}
    torch.manual_seed(0)
    first = residual_weights.save(ResidualPrior(1, 8, 8, 4), "gray", card, tmp_path)
    data = residual_weights.path_of("gray", tmp_path).read_bytes()
    for _ in range(3):  # the same prior saved again: the same bytes (its metadata's keys in one order), kept as is
        torch.manual_seed(0)
        assert residual_weights.save(ResidualPrior(1, 8, 8, 4), "gray", card, tmp_path) == first
    assert residual_weights.path_of("gray", tmp_path).read_bytes() == data
    assert not (tmp_path / W.ARCHIVE).exists()
    second = residual_weights.save(ResidualPrior(1, 8, 8, 4), "gray", card, tmp_path)
    assert second != first
    assert [p.name for p in (tmp_path / W.ARCHIVE).iterdir()] == [f"{first}.safetensors.zst"]
    frame = (tmp_path / W.ARCHIVE / f"{first}.safetensors.zst").read_bytes()
    assert zstandard.ZstdDecompressor().decompress(frame) == data


def test_weights_bytes_hold_their_metadata_in_sorted_order(tmp_path):
    meta = {k: f"value of {k}" for k in ("zeta", "config", "alpha", "lossy_model_id", "tables_digest")}
    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(5, dtype=torch.int32)}
    data = W.safetensors_bytes(tensors, meta)
    n = int.from_bytes(data[:8], "little")
    assert n % 8 == 0 and list(json.loads(data[8:8 + n])["__metadata__"]) == sorted(meta)
    (tmp_path / "w.safetensors").write_bytes(data)
    read, read_meta = W.read_tensors(tmp_path / "w.safetensors")
    assert read_meta == meta and sorted(read) == ["a", "b"]
    assert all(torch.equal(read[k], tensors[k]) for k in tensors)


def test_saved_weights_archive_the_ones_they_replace_and_load_by_id(tmp_path, monkeypatch):
    spec = registry.parse("balle2016-gray")
    path = tmp_path / f"{spec.name}.safetensors"
    ids = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        ids.append(W.save(architectures.build(spec), spec, path, {"note": "a test"}))
    assert [p.name for p in (tmp_path / W.ARCHIVE).iterdir()] == [f"{ids[0]}.safetensors.zst"]
    assert json.loads(path.with_suffix(".json").read_text())["model_id"] == ids[1]
    assert W.write_card(path, {"note": "another card"}, spec) == ids[1]  # a card alone: the same weights
    monkeypatch.setenv("VISEMZ_WEIGHTS_DIR", str(tmp_path))
    W.load.cache_clear()
    try:
        assert W.load(spec)[1] == ids[1] and W.load(spec, "cpu", ids[0])[1] == ids[0]
    finally:
        W.load.cache_clear()
