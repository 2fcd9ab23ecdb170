"""The evaluation's datasets: a folder's own images, and each of its sub-folders' (``eval/kodak``, ``eval/xray``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidArgumentError
from ..io.files import IMAGE_EXTENSIONS


def find_datasets(folder: Path, only: tuple[str, ...] | None, limit: int | None) -> dict[str, list[Path]]:
    """{dataset name: sorted image paths}: FOLDER's own images, then each sub-folder's."""
    if not folder.is_dir():
        raise InvalidArgumentError(f"evaluation folder {str(folder)!r} is not a folder")
    if limit is not None and limit < 1:
        raise InvalidArgumentError(f"limit={limit}: expected a positive number of images")

    def images(d: Path) -> list[Path]:
        return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS)

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
    return {d: paths[:limit] for d, paths in found.items()}
