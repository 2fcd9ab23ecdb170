"""The image codec: images <-> .vsz files of kind "image", and page stacks of kind "pages".

``ImageCodec`` (``codec.py``) glues the learned transform, the latent coding and the residual into
a container; ``visemz.compress`` / ``visemz.decompress`` use one per device.

- ``pixels.py``: images <-> model tensors (dtypes, value ranges, channel layouts, padding)
- ``tiling.py``: the tile grid, the tiles' analysis and synthesis windows, regions
- ``refine.py``: encoder-side latent refinement
- ``latents.py``: latent symbols <-> an image file's sections
- ``residual.py``, ``residual_coder.py``: the block-coded error-bound residual, the learned residual
- ``image_header.py``, ``tile_index.py``: the image header's schema, the tile index
- ``pages.py``: multi-page images in one "pages" container

The .vsz container (``visemz.container``, with its header dictionaries) and the binary framing
(``visemz.framing``) stay at the package root: the ``visemz`` command, the folder jobs, the block
encoder and the float codecs use them too.  Importing this package loads nothing else:
``ImageCodec`` (torch, CompressAI, the models) loads on first use, as ``visemz.ImageCodec`` does.
"""

__all__ = ["ImageCodec"]


def __getattr__(name: str):
    """``ImageCodec`` comes from ``codec`` (torch, the models) on first use, so importing a sibling stays lighter."""
    if name == "ImageCodec":
        from .codec import ImageCodec

        globals()[name] = ImageCodec  # later lookups skip this function
        return ImageCodec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
