"""visemz's benchmarks, each a module run as ``python -m visemz.benchmarks.<name> --help``.

Every benchmark prints the device it ran on, times medians of synchronised runs after a warm-up,
sets its figures against a baseline measured in the same run, and writes its report as JSON
(atomically; the profilers print theirs).  Data never ships with the package: each takes its data as
arguments.  Module names never repeat a library's (``vs_compressai``, ``zarr_chunks``), so no benchmark
hides the package it measures.

- ``collectives``: the compressed collectives against NCCL's own (under torchrun);
- ``encoder``: the block encoder on a GPU against a device copy and nvCOMP's codecs;
- ``float64_layers``: the coding networks' float64 convolutions, ATen's against conv64's implicit GEMM;
- ``lossless``: lossless and near-lossless throughput against JPEG XL and JPEG-LS;
- ``network``: the learned transforms under each GPU math setting;
- ``pipeline``: folder compression (streams, loaders, several GPUs) against CompressAI's loop and nvJPEG;
- ``profile_codec``, ``profile_collectives``: where one image's or one all_reduce's time goes;
- ``rans``: the conditional rANS coder against the block encoder and CompressAI's rANS;
- ``refine``: what encoder-side latent refinement buys (rate, quality, encode time);
- ``tiles``: tiled compression of large images (memory, throughput, regions, seams, lanes);
- ``vs_compressai``: CompressAI's own coder against visemz, same weights;
- ``zarr_chunks``: visemz's Zarr codec against JPEG 2000 and JPEG XL on the chunks of a large mosaic.

``common`` holds what they share.  ``import visemz`` never imports this package.
"""
