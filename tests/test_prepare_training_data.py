"""tools/prepare_training_data.py on small git repositories made here with the sources' layouts
(scikit-image's images), and tools/train.py reading what it writes."""

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

from visemz.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import prepare_training_data as ptd  # noqa: E402
import train  # noqa: E402

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 123\n"


def small(img: np.ndarray, side: int) -> np.ndarray:
    h, w = img.shape[:2]
    f = side / max(h, w)
    return cv2.resize(img, (round(w * f), round(h * f)), interpolation=cv2.INTER_AREA)


def bgr(img: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(img, cv2.COLOR_RGB2BGR)


def jpeg(img: np.ndarray) -> bytes:
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 92])[1].tobytes()


def png(img: np.ndarray) -> bytes:
    return cv2.imencode(".png", img)[1].tobytes()


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(folder: Path, files: dict[str, bytes], lose: tuple[str, ...] = ()) -> Path:
    """A git repository holding ``files`` in one commit; the blobs of ``lose`` removed from its
    object store (as a partial copy lacks its large files).  Returns its git directory."""
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    git(folder, "init", "-q")
    git(folder, "add", "-A")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "images")
    for name in lose:
        blob = git(folder, "rev-parse", f"HEAD:{name}")
        (folder / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    return folder / ".git"


def metadata(rows: list[dict]) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, ["filename", "patient_id", "url"])
    writer.writeheader()
    writer.writerows(rows)
    return ("\ufeff" + out.getvalue()).encode()  # COVID-CXNet's file starts with a BOM


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Three source repositories, the current training data, the evaluation set, and one run."""
    base = tmp_path_factory.mktemp("sources")
    astronaut, coffee, chelsea, rocket = (bgr(small(f(), 120)) for f in (data.astronaut, data.coffee, data.chelsea,
                                                                         data.rocket))
    photos = {"chelsea": chelsea, "coffee": coffee, "rocket": rocket}
    imagenet = make_repo(base / "imagenet", {
        "README.md": b"samples\n", "n001_chelsea's_cat.JPEG": jpeg(chelsea), "n002_coffee.JPEG": jpeg(coffee),
        "n003_astronaut.JPEG": jpeg(bgr(small(data.astronaut(), 160))),  # a Kodak image, at another size
        "n004_rocket.JPEG": jpeg(rocket), "n005_coins.JPEG": jpeg(small(data.coins(), 60))},  # a gray thumbnail
        lose=("n004_rocket.JPEG",))
    gravel = cv2.cvtColor(small(data.gravel(), 100), cv2.COLOR_GRAY2BGR)
    bsds = make_repo(base / "bsds", {
        "BSDS500/data/images/train/100.jpg": jpeg(rocket),
        "BSDS500/data/images/test/200.jpg": jpeg(bgr(small(data.immunohistochemistry(), 110))),  # CBSD68 by its id
        "BSDS500/data/images/val/300.jpg": jpeg(chelsea),  # the ImageNet one again
        "BSDS500/data/images/val/400.jpg": jpeg(gravel),
        "bench/data/images/100.jpg": jpeg(rocket)})  # outside the image folders: not read
    camera, moon, coins = small(data.camera(), 200), small(data.moon(), 90), small(data.coins(), 96)
    xrays = make_repo(base / "cxnet", {
        "metadata.csv": metadata([
            {"filename": "006.jpg", "patient_id": "7", "url": "https://example.org/ActualMed/case-7"},
            {"filename": "007.png", "patient_id": "7", "url": "https://example.org/case-7-day-4"},
            {"filename": "001.png", "patient_id": "1", "url": "https://example.org/case-1"}]),
        "chest_xray_images/covid19/001.png": png(coins),
        "chest_xray_images/covid19/002.jpg": jpeg(bgr(small(data.hubble_deep_field(), 150))),  # colour: to gray
        "chest_xray_images/covid19/003.png": png(np.clip(small(data.camera(), 180).astype(int) + 6, 0, 255)
                                                 .astype(np.uint8)),  # an evaluation X-ray, brighter and smaller
        "chest_xray_images/covid19/004.png": png(small(data.page(), 300)),  # longer than --xray-max-side
        "chest_xray_images/covid19/005.png": png(moon),  # already in train/gray
        "chest_xray_images/covid19/006.jpg": jpeg(small(data.text(), 100)),
        "chest_xray_images/covid19/007.png": png(small(data.clock(), 100)),
        "chest_xray_images/covid19/008.png": LFS_POINTER,
        "chest_xray_images/covid19/009.png": png(np.rot90(coins).copy())})  # 001 rotated: not a duplicate
    train_data = base / "DATA"
    (train_data / "train2" / "rgb" / "chunk_00").mkdir(parents=True)
    (train_data / "train" / "gray").mkdir(parents=True)
    noise = np.random.default_rng(0).integers(0, 256, (64, 96, 3), np.uint8)  # its pixels unlike BSDS 200's
    cv2.imwrite(str(train_data / "train2" / "rgb" / "chunk_00" / "bsd68_200.webp"), noise, ptd.WEBP_LOSSLESS)
    cv2.imwrite(str(train_data / "train" / "gray" / "em_moon.png"), small(data.moon(), 128))
    ev = base / "eval"
    (ev / "kodak").mkdir(parents=True)
    (ev / "xray").mkdir()
    cv2.imwrite(str(ev / "kodak" / "kodim01.png"), astronaut)
    cv2.imwrite(str(ev / "xray" / "xray_15.png"), camera)
    out = base / "out"
    argv = ["--imagenet", str(imagenet), "--bsds", str(bsds), "--cxnet", str(xrays), "--train-data", str(train_data),
            "--eval", str(ev), "--out", str(out), "--xray-max-side", "256", "--min-side", "40", "--chunk-mb", "0.02"]
    ptd.main(argv)
    manifest = json.loads((out / "train3" / "manifest.json").read_text())
    return {"argv": argv, "out": out, "manifest": manifest, "photos": photos, "repos": (imagenet, bsds, xrays),
            "coins": coins}


def by_path(manifest: dict) -> dict[tuple[str, str], dict]:
    rows = {}
    for row in manifest["kept"] + manifest["dropped"]:
        key = (row["source"], row["path"])
        assert key not in rows, f"{key} listed twice"
        rows[key] = row
    return rows


def test_every_file_is_kept_or_dropped_with_its_reason(world):
    rows = by_path(world["manifest"])
    reasons = {(s, Path(p).name): r.get("reason", "kept") for (s, p), r in rows.items()}
    assert reasons == {
        ("imagenet", "n001_chelsea's_cat.JPEG"): "kept", ("imagenet", "n002_coffee.JPEG"): "kept",
        ("imagenet", "n003_astronaut.JPEG"): "eval_duplicate", ("imagenet", "n004_rocket.JPEG"): "absent",
        ("imagenet", "n005_coins.JPEG"): "too_small",
        ("bsds", "100.jpg"): "kept", ("bsds", "200.jpg"): "cbsd68", ("bsds", "300.jpg"): "duplicate",
        ("bsds", "400.jpg"): "kept",
        ("cxnet", "001.png"): "kept", ("cxnet", "002.jpg"): "kept", ("cxnet", "003.png"): "eval_duplicate",
        ("cxnet", "004.png"): "kept", ("cxnet", "005.png"): "in_training", ("cxnet", "006.jpg"): "eval_source",
        ("cxnet", "007.png"): "eval_source", ("cxnet", "008.png"): "lfs_pointer", ("cxnet", "009.png"): "kept"}
    assert "kodak/kodim01.png" in rows[("imagenet", "n003_astronaut.JPEG")]["detail"]
    assert "xray/xray_15.png" in rows[("cxnet", "chest_xray_images/covid19/003.png")]["detail"]
    assert "n001_chelsea-s_cat" in rows[("bsds", "BSDS500/data/images/val/300.jpg")]["detail"]
    assert "45x35 resized, under --min-side 40" in rows[("imagenet", "n005_coins.JPEG")]["detail"]
    assert "patient 7" in rows[("cxnet", "chest_xray_images/covid19/007.png")]["detail"]
    assert "train/gray/em_moon.png" in rows[("cxnet", "chest_xray_images/covid19/005.png")]["detail"]


def test_manifest_names_each_source_and_its_commit(world):
    m = world["manifest"]
    for name, repo in zip(("imagenet", "bsds", "cxnet"), world["repos"]):
        source = m["sources"][name]
        assert source["repository"] == ptd.REPOSITORIES[name]
        assert source["commit"] == git(repo.parent, "rev-parse", "HEAD")
        assert source["kept"] + sum(source["dropped"].values()) == source["files"]
    assert m["sources"]["cxnet"]["dropped"] == {"eval_duplicate": 1, "eval_source": 2, "in_training": 1,
                                                "lfs_pointer": 1}
    kept = m["kept"]
    assert all(k["nearest_eval"]["distance"] > m["settings"]["hash_distance"] for k in kept)
    for k in kept:
        assert (world["out"] / "train3" / k["file"]).stat().st_size == k["bytes"]


def test_photos_are_downscaled_by_area_into_lossless_webp(world):
    out = world["out"] / "train3"
    for name, stem in (("chelsea", "inet_n001_chelsea-s_cat"), ("coffee", "inet_n002_coffee"), ("rocket", "bsds_100")):
        (path,) = out.glob(f"rgb/chunk_*/{stem}.webp")
        source = cv2.imdecode(np.frombuffer(jpeg(world["photos"][name]), np.uint8), cv2.IMREAD_COLOR)
        h, w = source.shape[:2]
        expected = cv2.resize(source, (round(w * 0.75), round(h * 0.75)), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), expected)


def test_xrays_are_8bit_gray_at_native_size_or_capped(world):
    out = world["out"] / "train3"
    rows = {Path(k["path"]).name: k for k in world["manifest"]["kept"] if k["source"] == "cxnet"}
    coins = cv2.imread(str(out / rows["001.png"]["file"]), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(coins, world["coins"])  # native size, pixels as they were
    page = cv2.imread(str(out / rows["004.png"]["file"]), cv2.IMREAD_UNCHANGED)
    assert max(page.shape) == 256 and rows["004.png"]["from_size"] == [300, 149]
    colour = cv2.imread(str(out / rows["002.jpg"]["file"]), cv2.IMREAD_UNCHANGED)
    assert colour.ndim == 2 and colour.dtype == np.uint8 and rows["002.jpg"]["converted"] == "3 channels to gray"
    assert all(Path(k["file"]).name.startswith("xr_") for k in rows.values())


def test_chunks_stay_under_the_limit_and_hold_every_image_once(world):
    m, out = world["manifest"], world["out"] / "train3"
    limit = m["settings"]["chunk_bytes"]
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert sorted(out / k["file"] for k in m["kept"]) == files
    for kind in ("rgb", "gray"):
        chunks = {f: c for f, c in m["chunks"].items() if f.startswith(kind)}
        total = sum(c["bytes"] for c in chunks.values())
        assert len(chunks) >= max(2, math.ceil(total / limit))
        for folder, c in chunks.items():
            on_disk = list((out / folder).iterdir())
            assert len(on_disk) == c["images"] and sum(p.stat().st_size for p in on_disk) == c["bytes"] <= limit


def test_chunk_assignment_deals_every_source_over_every_chunk():
    sizes = [9, 8, 7, 6, 5, 4, 3, 3, 2, 2, 1, 1]
    sources = ["a"] * 6 + ["b"] * 6
    chunk = ptd.assign_chunks(sizes, sources, 18)
    fill = np.bincount(chunk, weights=sizes)
    assert fill.max() <= 18 and len(fill) == math.ceil(sum(sizes) / 18)
    for k in range(len(fill)):
        assert {s for s, c in zip(sources, chunk) if c == k} == {"a", "b"}
    with pytest.raises(InvalidArgumentError, match="20 bytes"):
        ptd.assign_chunks([20, 1], ["a", "a"], 18)


def test_train_reads_the_new_folders_with_xrays_in_their_group(world):
    rgb = train.load_images(world["out"], "rgb")
    gray = train.load_images(world["out"], "gray")
    m = world["manifest"]
    assert len(rgb) == sum(k["file"].startswith("rgb/") for k in m["kept"])
    groups = [im.group for im in gray]
    assert groups.count("xray") == sum(k["file"].startswith("gray/") for k in m["kept"])
    assert groups.count("photo") == len(rgb)  # the photos' luminance


def test_an_existing_output_is_refused_before_any_work(world, tmp_path):
    argv = list(world["argv"])
    before = sorted(p.relative_to(world["out"]) for p in world["out"].rglob("*"))
    with pytest.raises(SystemExit, match="exists already"):
        ptd.main(argv)
    assert sorted(p.relative_to(world["out"]) for p in world["out"].rglob("*")) == before  # nothing left or changed
    argv[argv.index("--cxnet") + 1] = str(tmp_path)
    argv[argv.index("--out") + 1] = str(tmp_path / "out")
    with pytest.raises(SystemExit, match="not a git directory"):
        ptd.main(argv)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, value, message", [("--scale", "1.5", "--scale"), ("--chunk-mb", "0", "--chunk-mb"),
                                                  ("--hash-distance", "200", "--hash-distance"),
                                                  ("--min-side", "-1", "--min-side")])
def test_bad_settings_are_named(world, tmp_path, flag, value, message):
    argv = list(world["argv"])
    argv[argv.index("--out") + 1] = str(tmp_path / "out")
    argv += [flag, value]
    with pytest.raises(SystemExit, match=message):
        ptd.main(argv)
    assert not (tmp_path / "out").exists()
