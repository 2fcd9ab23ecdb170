"""The integer prior's 8-bit kernel (models/conv8.py) against its float64 path, bit for bit: on a GPU, and in
Triton's interpreter."""

import os
import subprocess
import sys

import pytest
import torch

from visemz.models import conv8
from visemz.models import integer_prior as IP

from .helpers import optional


def random_net(channels: int, seed: int) -> IP.IntegerNet:
    """An integer prior of seeded layers whose multipliers spread the activations over 0..127 (neither all zero nor
    all saturated), with the sizes the kernel takes at their largest for a colour prior."""
    g = torch.Generator().manual_seed(seed)

    def layer(o, i, k, out=False):
        w = torch.randint(-127, 128, (o, i, k, k), generator=g).to(torch.int8)
        b = torch.randint(-50000, 50000, (o,), generator=g).to(torch.int32)
        if out:
            return IP.IntegerLayer(w, b, None, torch.rand(o, generator=g, dtype=torch.float64) / 1000)
        return IP.IntegerLayer(w, b, torch.randint(1 << 21, 1 << 23, (o,), generator=g), None)

    c4, width, reduced = 4 * channels, 48, 32
    return IP.IntegerNet(channels, 128, width, reduced, torch.zeros(reduced, 128, 1, 1), torch.zeros(reduced),
                         [layer(width, reduced + c4 + 2, 3), layer(width, width, 3), layer(width, width, 3)],
                         [(layer(width, width + c4, 3), layer(width, width, 3), layer(2 * channels, width, 1, True))
                          for _ in range(4)])


def check_kernel(device: str) -> None:
    """Trunk and heads of gray and colour priors on the kernel equal the float64 path's, over sizes that are not
    multiples of the kernel's tiles; the activations are spread (the test would see a wrong requantisation)."""
    for channels, (b, h, w) in ((1, (2, 9, 37)), (3, (1, 33, 5))):
        net = random_net(channels, channels)
        g = torch.Generator().manual_seed(10 + channels)
        r = torch.randint(-127, 128, (b, net.reduced, h, w), generator=g)
        recon = torch.randint(0, 128, (b, 4 * channels, h, w), generator=g)
        context = torch.randint(-127, 128, (b, 4 * channels, h, w), generator=g)
        want = net.condition(r, recon, (3, -5))
        assert 0.1 < float((want > 0).float().mean()) < 0.9 and int(want.max()) == IP.ACT_MAX
        on = net.to(device)
        got = conv8.trunk(on, r.to(device), recon.to(device), (3, -5))
        assert torch.equal(got.buffer[..., :net.width].permute(0, 3, 1, 2).cpu(), want), (channels, "trunk")
        for k in range(4):
            for a, c in zip(net.head(k, want, context), on.head(k, got, context.to(device))):
                assert torch.equal(a, c.cpu()), (channels, k)


@pytest.mark.gpu
def test_kernel_equals_the_float64_path_on_the_gpu():
    optional("triton")
    assert conv8.available()
    check_kernel("cuda")


@pytest.mark.gpu
def test_the_prior_takes_the_kernel_on_a_gpu_unless_turned_off():
    optional("triton")
    from visemz import defaults

    net = random_net(1, 7).to("cuda")
    r, recon = torch.zeros(1, 32, 8, 8, device="cuda"), torch.zeros(1, 4, 8, 8, device="cuda")
    assert isinstance(net.condition(r, recon, (0, 0)), conv8.Trunk)
    with defaults.set(implicit_gemm=0):
        assert isinstance(net.condition(r, recon, (0, 0)), torch.Tensor)


def test_kernel_equals_the_float64_path_in_tritons_interpreter():
    """The kernel as written, run by Triton's interpreter on the CPU."""
    optional("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", "from tests.test_conv8 import check_kernel; check_kernel('cpu')"],
                         env=env, capture_output=True, text=True, timeout=240,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-3000:]


def test_sizes_the_kernel_takes():
    assert conv8.fits(random_net(1, 0)) and conv8.fits(random_net(3, 0))
    wide = random_net(1, 0)
    wide.width = 64  # 64 trunk channels leave no room for the context
    assert not conv8.fits(wide)
