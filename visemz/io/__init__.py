"""Files in and out, shared by the folder pipeline, the evaluation and the collectives' stacking job.

``files``: which inputs a job handles and where outputs go; ``loaders``: images read on the CPU
(OpenCV, tifffile, NumPy) and written as PNG, TIFF or .npy; ``writers``: atomic output files.
GPU readers and writers (DALI, kvikio) belong to the pipeline, which routes files to them.
"""
