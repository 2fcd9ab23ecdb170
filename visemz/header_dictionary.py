"""The zstd dictionaries that .vsz containers of version 2 compress their JSON header with.

A container's header names its dictionary by number (docs/FORMAT.md, section 3).  A dictionary is
raw content (zstd's "raw content" dictionary: history the frame may copy from, no entropy tables):
typical headers of each kind, the commonest last (nearer copies cost fewer bits).  A file holds
only the number, so a dictionary never changes once files use it: a better one is added under a
new number, and ``tests/test_container.py`` pins each one's xxh64.
"""

from __future__ import annotations

DICTIONARIES: dict[int, bytes] = {
    1: (
        b'{"kind":"pages","sections":["index","pages"],"meta":{"format":1,"shape":[16,1024,1024],"dtype":"uint16"}}'
        b'{"kind":"image","sections":["tile_index","tiles"],"meta":{"format":5,"model":"balle2016-gray",'
        b'"model_id":"","quality":4.0,"dtype":"float32","shape":[2048,2048],"range":[0.0,1.0],"max_error":0.0,'
        b'"residual":"bits","entropy":"ans","tiles":{"size":4096,"halo":[32,16],"grid":[2,2],'
        b'"parts":["exception_bits","exceptions","mask","residual","y"],"symbols":["y"]}}}'
        b'{"kind":"image","sections":["tile_index","tiles"],"meta":{"format":5,"model":"balle2016-rgb",'
        b'"model_id":"","quality":2.0,"dtype":"uint8","shape":[512,768,3],"range":[0.0,255.0],"max_error":null,'
        b'"residual":null,"entropy":"none","tiles":{"size":4096,"halo":[32,16],"grid":[1,1],"parts":["y"],'
        b'"symbols":["y"]}}}'
        b'{"kind":"image","sections":["tile_index","tiles"],"meta":{"format":5,"model":"mbt2018-mean-gray",'
        b'"model_id":"","quality":1.0,"dtype":"uint16","shape":[2400,1900],"range":[0.0,65535.0],"max_error":1,'
        b'"residual":"int","entropy":"zstd","tiles":{"size":4096,"halo":[32,16],"grid":[1,1],'
        b'"parts":["mask","residual","y","y_scales","z"],"symbols":["y","z"]}}}'
        b'{"kind":"image","sections":["tile_index","tiles"],"meta":{"format":5,"model":"mbt2018-mean-rgb",'
        b'"model_id":"","quality":8.0,"dtype":"uint8","shape":[768,512,3],"range":[0.0,255.0],"max_error":null,'
        b'"residual":null,"entropy":"zstd","tiles":{"size":4096,"halo":[32,16],"grid":[1,1],'
        b'"parts":["y","y_scales","z"],"symbols":["y","z"]}}}'
    ),
}
