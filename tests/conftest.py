import numpy as np
import pytest

from visemz import device


def pytest_collection_modifyitems(config, items):
    if device.cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine with -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """Array module under test, in the style of kvikio's tests: numpy always, cupy on a GPU."""
    if request.param == "numpy":
        return np
    import cupy

    return cupy
