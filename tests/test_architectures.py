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
    torch.testing.assert_close(units.at(2.5, torch.float64, "cpu")[1], fresh.at(2.5, torch.float64, "cpu")[1], rtol=0, atol=0)
    with torch.no_grad():
        units.log_gain.add_(0.5)  # an optimiser step's in-place write
    g2, _ = units.at(2.5, torch.float32, "cpu")
    torch.testing.assert_close(g2, g * math.exp(0.5), rtol=1e-6, atol=0)
    units.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(units.at(2.5, torch.float32, "cpu")[0], fresh.at(2.5, torch.float32, "cpu")[0], rtol=0, atol=0)
    for k in range(architectures._AT_CACHE_SIZE + 3):  # a long sweep of qualities keeps the cache bounded
        units.at(1 + k / 20, torch.float32, "cpu")
    assert len(units._at_cache) <= architectures._AT_CACHE_SIZE
