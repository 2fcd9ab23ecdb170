"""The evaluation's datasets: a folder's own images, and each of its sub-folders' (``eval/kodak``, ``eval/xray``),
each image taken through a ``View`` (gray conversion, central crop) before it is coded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ..config import whole_number
from ..errors import InvalidArgumentError, UnsupportedFormatError
from ..io.files import IMAGE_EXTENSIONS
from ..io.loaders import load_image


@dataclass(frozen=True)
class View:
    """How each image is taken: converted to gray (``gray``), then cut to its central ``crop`` x ``crop``
    pixels (``crop``; a side shorter than ``crop`` is kept whole).

    A viewed dataset is named after its folder with the view as a suffix (``xray-gray-crop512``), so its
    points never mix with the whole images' in a resumed run's CSV."""

    crop: int | None = None
    gray: bool = False

    def __post_init__(self):
        if self.crop is not None and (not whole_number(self.crop) or self.crop < 1):
            raise InvalidArgumentError(f"crop={self.crop!r}: expected a positive whole number of pixels")

    @property
    def suffix(self) -> str:
        return ("-gray" if self.gray else "") + (f"-crop{self.crop}" if self.crop else "")

    def apply(self, image: np.ndarray) -> np.ndarray:
        if self.gray:
            image = to_gray(image)
        if self.crop:
            h, w = image.shape[:2]
            y, x = max(h - self.crop, 0) // 2, max(w - self.crop, 0) // 2
            image = np.ascontiguousarray(image[y:y + self.crop, x:x + self.crop])
        return image


def to_gray(image: np.ndarray) -> np.ndarray:
    """An image's luma (OpenCV's BT.601 weights, rounded, in the image's own dtype); gray stays as it is."""
    if image.ndim == 2:
        return image
    if image.ndim == 3 and image.shape[2] == 1:
        return np.ascontiguousarray(image[..., 0])
    conversions = {3: cv2.COLOR_RGB2GRAY, 4: cv2.COLOR_RGBA2GRAY}
    if image.ndim != 3 or image.shape[2] not in conversions:
        raise UnsupportedFormatError(f"image of shape {image.shape}: gray conversion takes gray, RGB or RGBA")
    return cv2.cvtColor(image, conversions[image.shape[2]])


def load(path: Path, view: View) -> np.ndarray:
    """One dataset image as the evaluation codes it."""
    return view.apply(load_image(path))


def find_datasets(folder: Path, only: tuple[str, ...] | None, limit: int | None,
                  view: View = View()) -> dict[str, list[Path]]:
    """{dataset name (folder name + the view's suffix): sorted image paths}: FOLDER's own images, then each
    sub-folder's; ``only`` names folders."""
    if not folder.is_dir():
        raise InvalidArgumentError(f"evaluation folder {str(folder)!r} is not a folder")
    if limit is not None and limit < 1:
        raise InvalidArgumentError(f"limit={limit}: expected a positive number of images")

    def images(d: Path) -> list[Path]:
        return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")
                      and p.suffix.lower() in IMAGE_EXTENSIONS)

    found = {folder.name: images(folder)} if images(folder) else {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if images(sub):
            found[sub.name] = images(sub)
    if only is not None:
        missing = [d for d in only if d not in found]
        if missing:
            raise InvalidArgumentError(f"dataset(s) {missing} not found in {str(folder)!r}; found {sorted(found)}")
        found = {d: found[d] for d in only}
    if not found:
        raise InvalidArgumentError(f"no images in {str(folder)!r} or its sub-folders")
    return {d + view.suffix: paths[:limit] for d, paths in found.items()}


def model_sets(data: Path, variant: str, limit: int | None = None) -> dict[str, list[tuple[str, np.ndarray]]]:
    """{set name: [(file name, image)]}: the sets a model of ``variant`` is reported on, under ``data/eval``
    (the model cards' and the CompressAI comparison's).  RGB models: Kodak (``kodak``).  Grayscale models: the
    X-ray set (``xray``) and Kodak's luma (``kodak-gray``), each image taken through ``View(gray=True)``."""
    root = data / "eval"
    if variant == "rgb":
        named = {"kodak": ("kodak", View())}
    else:
        named = {"xray": ("xray", View(gray=True)), "kodak-gray": ("kodak", View(gray=True))}
    out = {}
    for name, (folder, view) in named.items():
        (paths,) = find_datasets(root, (folder,), limit).values()
        out[name] = [(p.name, load(p, view)) for p in paths]
    return out
