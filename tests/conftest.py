import math
import os

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import visemz
from visemz import cuda
from visemz.cli import app
from visemz.models import all_specs, architectures, integer_prior, registry, residual_prior, residual_weights
from visemz.models import weights as W

from .helpers import optional
from .rans_cases import gaussian_tables


def pytest_collection_modifyitems(config, items):
    if cuda.cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on a GPU machine with -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module under test, as in kvikio's tests: NumPy (the CPU path) always, cupy (the GPU
    path) on a GPU.  A test taking ``xp`` runs once per device and holds both to the same bytes."""
    return np if request.param == "numpy" else optional("cupy")


@pytest.fixture
def nvcomp():
    """nvCOMP, which the GPU's entropy stage (zstd, ANS) needs: the test is skipped without it."""
    return optional("nvidia.nvcomp")


@pytest.fixture(scope="module")
def cp():
    """cupy (GPU tests): the test is skipped without it."""
    return optional("cupy")


@pytest.fixture
def eval_extra():
    """The evaluation's optional libraries (the 'eval' extra, in 'test' too): without them the test is skipped."""
    for module in ("piq", "pysz", "zfpy", "imagecodecs"):
        optional(module)


@pytest.fixture(scope="session")
def tables():
    """The conditional rANS tests' CDF tables: the Gaussian tables of the default scale table."""
    return gaussian_tables()


@pytest.fixture(scope="session")
def model_weights(tmp_path_factory):
    """The shipped weights when all are present; otherwise seeded random weights in a temp folder.

    The codec's guarantees (shapes, dtypes, error bound, file validation) hold for any weights;
    rate-distortion quality is measured by ``visemz eval`` and the benchmarks, not by tests.  A
    channel-context model whose weights are not shipped (yet) gets seeded random weights beside the
    others' (the shipped files linked into the temp folder, so every other model keeps its weights and ids).
    """
    older = [s for s in all_specs() if not s.context]
    context = [s for s in all_specs() if s.context]
    shipped = all(W.weights_path(s).is_file() for s in older) and all(
        residual_weights.path_of(v, integer=i).is_file() for v in ("gray", "rgb") for i in (False, True))
    if shipped and all(W.weights_path(s).is_file() for s in context):
        yield W.weights_dir()
        return
    folder = tmp_path_factory.mktemp("weights")
    if shipped:  # the shipped files and the archive of older weights
        for f in W.weights_dir().iterdir():
            (folder / f.name).symlink_to(f.resolve())
    else:
        _random_weights(older, folder)
    torch.manual_seed(1)
    for s in context:
        if not (folder / f"{s.name}.safetensors").is_file():
            W.save(architectures.build(s), s, folder / f"{s.name}.safetensors", {"note": "random weights for tests"})
    old = os.environ.get("VISEMZ_WEIGHTS_DIR")
    os.environ["VISEMZ_WEIGHTS_DIR"] = str(folder)
    W.load.cache_clear()
    residual_weights.load.cache_clear()
    yield folder
    if old is None:
        del os.environ["VISEMZ_WEIGHTS_DIR"]
    else:
        os.environ["VISEMZ_WEIGHTS_DIR"] = old
    W.load.cache_clear()
    residual_weights.load.cache_clear()


def _random_weights(specs, folder) -> None:
    """Seeded random weights of ``specs`` and of the residual priors in ``folder``."""
    torch.manual_seed(0)
    for s in specs:
        W.save(architectures.build(s), s, folder / f"{s.name}.safetensors", {"note": "random weights for tests"})
    for variant in ("gray", "rgb"):
        lossy = registry.spec(registry.DEFAULT_MODEL, variant)
        prior = residual_prior.ResidualPrior(lossy.channels, lossy.N)
        for head in prior.heads:  # away from the all-zero start, so that the predictions differ from pixel to pixel
            torch.nn.init.normal_(head[-1].weight, std=0.01)
        card = {"lossy_model": lossy.name, "lossy_model_id": W.file_id(folder / f"{lossy.name}.safetensors"),
                "note": "random weights for tests"}
        residual_weights.save(prior, variant, card, folder)
        integer = integer_prior.IntegerPrior(lossy.channels, lossy.N)
        integer.load_state_dict(prior.state_dict(), strict=False)
        integer.log_act.data.fill_(math.log(0.05))  # activations of a few units over 0..127
        integer.log_reduced.data.fill_(math.log(0.02))
        residual_weights.save(integer.integers(), variant, card, folder)


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


@pytest.fixture(scope="module")
def cpu(model_weights):
    """An ImageCodec on the CPU, one per test module, with the tests' weights (``model_weights``)."""
    return visemz.ImageCodec("cpu")


@pytest.fixture(scope="module")
def gpu_cpu_codecs(model_weights):
    """An ImageCodec on the GPU and one on the CPU (GPU tests; skips without nvCOMP)."""
    optional("nvidia.nvcomp")  # the GPU's entropy stage
    return visemz.ImageCodec("cuda"), visemz.ImageCodec("cpu")
