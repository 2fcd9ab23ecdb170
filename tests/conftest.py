import numpy as np
import pytest
from typer.testing import CliRunner

from visemz import device
from visemz.cli import app


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


@pytest.fixture(scope="session")
def model_weights(tmp_path_factory):
    """The shipped weights when all are present; otherwise seeded random weights in a temp folder.

    The codec's guarantees (shapes, dtypes, error bound, file validation) hold for any weights;
    rate-distortion quality is measured by scripts/, not by tests.
    """
    import os

    import torch

    from visemz.models import all_specs, architectures
    from visemz.models import weights as W

    if all(W.weights_path(s).is_file() for s in all_specs()):
        yield W.weights_dir()
        return
    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    for s in all_specs():
        W.save(architectures.build(s), s, folder / f"{s.name}.safetensors", {"note": "random weights for tests"})
    old = os.environ.get("VISEMZ_WEIGHTS_DIR")
    os.environ["VISEMZ_WEIGHTS_DIR"] = str(folder)
    W.load.cache_clear()
    yield folder
    if old is None:
        del os.environ["VISEMZ_WEIGHTS_DIR"]
    else:
        os.environ["VISEMZ_WEIGHTS_DIR"] = old
    W.load.cache_clear()


@pytest.fixture
def cli(model_weights):
    """Run the ``visemz`` command in this process (typer's runner): ``cli("compress", src, dst, ...)``.

    Returns the runner's result (``exit_code``, ``stdout``, ``stderr``).  An exception other than
    the command's own exit is re-raised, so a bug fails the test with its traceback."""
    runner = CliRunner()

    def run(*args):
        result = runner.invoke(app, [str(a) for a in args], prog_name="visemz")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result

    return run
