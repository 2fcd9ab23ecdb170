"""The gained architectures' inference pieces (visemz.models.architectures)."""

import math

import torch

from visemz.models import architectures


def test_cached_gains_follow_the_parameters_and_serve_autograd():
    """GainUnits.at caches its pair per quality, dtype and device (no copy to the device per image), yet a
    changed parameter gives new gains, and a pair first made under inference mode is an ordinary tensor
    that a later differentiable use (encoder-side refinement) may save for backward."""
    units = architectures.GainUnits(4)
    with torch.inference_mode():
        g, inv = units.at(2.5, torch.float32, "cpu")
    assert units.at(2.5, torch.float32, "cpu")[0] is g  # cached
    assert not g.is_inference() and not g.requires_grad
    y = torch.ones(1, 4, 1, 1, requires_grad=True)
    (y * inv).sum().backward()  # an inference tensor here would raise
    torch.testing.assert_close(y.grad, inv)
    fresh = architectures.GainUnits(4)
    torch.testing.assert_close(units.at(2.5, torch.float64, "cpu")[1], fresh.at(2.5, torch.float64, "cpu")[1],
                               rtol=0, atol=0)
    with torch.no_grad():
        units.log_gain.add_(0.5)  # an optimiser step's in-place write
    g2, _ = units.at(2.5, torch.float32, "cpu")
    torch.testing.assert_close(g2, g * math.exp(0.5), rtol=1e-6, atol=0)
    units.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(units.at(2.5, torch.float32, "cpu")[0], fresh.at(2.5, torch.float32, "cpu")[0],
                               rtol=0, atol=0)
    for k in range(architectures._AT_CACHE_SIZE + 3):  # a long sweep of qualities keeps the cache bounded
        units.at(1 + k / 20, torch.float32, "cpu")
    assert len(units._at_cache) <= architectures._AT_CACHE_SIZE


def test_native_forward_equals_the_modules_forward():
    """The float64 hyper-synthesis's GPU route (ATen's im2col + GEMM convolutions) computes what the
    modules compute: on the CPU, the shipped mbt2018-mean h_s and a Sequential with layers it must
    leave to the modules (groups, dilation, reflect padding) agree to float64 rounding."""
    import copy

    from visemz.models import registry
    from visemz.models import weights as W

    net, _ = W.load(registry.parse("mbt2018-mean-rgb"), "cpu")
    h_s = copy.deepcopy(net.h_s).double()
    z = torch.randn(2, h_s[0].in_channels, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = h_s(z)
        got = architectures.native_forward(h_s, z)
    assert got.shape == ref.shape and torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    odd = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1, groups=2), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2),
                              torch.nn.Conv2d(8, 6, 3, padding=1, padding_mode="reflect"),
                              torch.nn.ConvTranspose2d(6, 3, 4, stride=2, padding=1),
                              torch.nn.Conv2d(3, 5, 3, padding="same")).double()
    x = torch.randn(1, 4, 9, 11, dtype=torch.float64)
    with torch.inference_mode():
        assert torch.allclose(architectures.native_forward(odd, x), odd(x), rtol=1e-12, atol=1e-12)
    # off the GPU, or in float32, hyper_synthesis is the modules' forward
    with torch.inference_mode():
        assert torch.equal(architectures.hyper_synthesis(net, z.float()), net.h_s(z.float()))


def test_frozen_gdn_computes_what_compressais_layer_computes():
    """freeze_gdn: the same outputs bit for bit (GDN and IGDN, float32 and a float64 copy), the same state
    dict; a dtype change without freezing again falls back to CompressAI's computation."""
    import copy

    from compressai.layers import GDN

    torch.manual_seed(0)
    layers = torch.nn.Sequential(GDN(8), torch.nn.Conv2d(8, 8, 1), GDN(8, inverse=True))
    for p in layers.parameters():
        p.data += 0.05 * torch.rand_like(p)
    x = torch.randn(2, 8, 5, 6)
    with torch.no_grad():
        want, want64 = layers(x), copy.deepcopy(layers).double()(x.double())
    keys = set(layers.state_dict())
    frozen = architectures.freeze_gdn(copy.deepcopy(layers))
    assert {type(m).__name__ for m in frozen} == {"FrozenGDN", "Conv2d"} and set(frozen.state_dict()) == keys
    with torch.no_grad():
        assert torch.equal(frozen(x), want)
        cast = copy.deepcopy(frozen).double()  # buffers cast, not derived in float64: CompressAI's path
        assert torch.equal(cast(x.double()), want64)
        assert torch.equal(architectures.freeze_gdn(cast)(x.double()), want64)
