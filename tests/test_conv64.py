"""The float64 implicit-GEMM convolutions (models/conv64.py) against torch's: on a GPU, and in Triton's interpreter."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
from compressai.layers import GDN

from visemz import defaults
from visemz.models import architectures, conv64

from .helpers import optional

# (layer, input shape, ReLU after it): stride-1 convolutions of several kernels, transposed ones whose phases take
# 9/6/6/4 taps (g_s's), a phase of no taps at all (stride 3, kernel 2: the bias alone), channels not a multiple of 16
LAYERS = [
    (lambda: torch.nn.Conv2d(5, 7, 3, padding=1), (2, 5, 9, 11), True),
    (lambda: torch.nn.Conv2d(20, 3, 1), (1, 20, 6, 5), False),
    (lambda: torch.nn.Conv2d(4, 6, 5, padding=2), (1, 4, 7, 8), False),
    (lambda: torch.nn.Conv2d(4, 6, 3, padding=0), (1, 4, 7, 8), True),
    (lambda: torch.nn.ConvTranspose2d(6, 5, 5, stride=2, padding=2, output_padding=1), (2, 6, 5, 7), False),
    (lambda: torch.nn.ConvTranspose2d(6, 1, 5, stride=2, padding=2, output_padding=1), (1, 6, 4, 3), True),
    (lambda: torch.nn.ConvTranspose2d(3, 4, 3, stride=1, padding=1), (1, 3, 4, 5), False),
    (lambda: torch.nn.ConvTranspose2d(3, 4, 2, stride=3, padding=0), (1, 3, 4, 5), True),
    (lambda: torch.nn.Conv2d(5, 48, 3, padding=1), (1, 5, 6, 7), True),  # two output blocks, 32 + 16
    (lambda: torch.nn.Conv2d(6, 40, 1), (1, 6, 5, 4), False),  # two blocks, the second's last 8 outputs masked
]


def frozen_gdn(channels: int, inverse: bool, device: str) -> architectures.FrozenGDN:
    """A float64 GDN frozen with seeded positive parameters away from its initial identity."""
    g = architectures.freeze_gdn(torch.nn.Sequential(GDN(channels, inverse=inverse)).double().to(device))[0]
    g.gamma_eff.copy_(0.2 * torch.rand(g.gamma_eff.shape, dtype=torch.float64))
    g.beta_eff.copy_(0.5 + torch.rand(channels, dtype=torch.float64))
    return g.requires_grad_(False)


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and got.dtype == torch.float64 and \
        float((got - want).abs().max()) <= 1e-13 * float(want.abs().max())


@torch.no_grad()
def check_layers(device: str) -> None:
    """Every layer kind against torch's, the inputs channels first and last (the outputs laid out as the input), a
    convolution's input in two parts of different layouts (read where they lie), positions by rows and by tiles."""
    torch.manual_seed(0)
    tiles = conv64.TILE_W, conv64.TILE_W_LAST
    for tile_w, tile_w_last in ((0, 0), (4, 8)):
        conv64.TILE_W, conv64.TILE_W_LAST = tile_w, tile_w_last
        try:
            for make, shape, relu in LAYERS:
                layer = make().double().to(device)
                x = torch.randn(*shape, dtype=torch.float64, device=device)
                want = layer(x).clamp_min(0) if relu else layer(x)
                run = conv64.conv2d if isinstance(layer, torch.nn.Conv2d) else conv64.conv_transpose2d
                for given in (x, x.contiguous(memory_format=torch.channels_last)):
                    got = run(given, layer, relu)
                    assert close(got, want), (layer, shape)
                    assert got.is_contiguous(memory_format=conv64.layout_of(given))
                if isinstance(layer, torch.nn.Conv2d) and shape[1] > 1:
                    c1 = shape[1] // 2
                    for first in (x[:, :c1].contiguous(memory_format=torch.channels_last), x[:, :c1].contiguous()):
                        parts = (first, x[:, c1:].contiguous())
                        assert close(conv64.conv2d(parts, layer, relu), want), (layer, shape, "parts")
                        head = torch.nn.Conv2d(layer.out_channels, 2, 1).double().to(device)
                        assert conv64.fuses_head(layer, head)
                        assert close(conv64.conv2d(parts, layer, relu, head=head), head(want)), (layer, shape, "head")
            for channels, inverse in ((20, True), (20, False), (48, True)):
                g = frozen_gdn(channels, inverse, device)
                x = torch.randn(2, channels, 5, 6, dtype=torch.float64, device=device)
                for given in (x, x.contiguous(memory_format=torch.channels_last)):
                    assert close(conv64.gdn(given, g.gamma_eff, g.beta_eff, inverse), g(x)), (channels, inverse)
        finally:
            conv64.TILE_W, conv64.TILE_W_LAST = tiles


@pytest.mark.gpu
def test_layers_equal_torchs_on_the_gpu():
    optional("triton")
    check_layers("cuda")


@pytest.mark.gpu
@torch.no_grad()
def test_weights_prepared_on_a_busy_stream_are_read_right_on_another():
    """A layer's weights are prepared for the kernel once, on the stream of the first call, and cached for every
    stream: a second stream must not read them before the first stream, still busy, has written them."""
    optional("triton")
    assert conv64.available()
    layer = torch.nn.Conv2d(48, 48, 3, padding=1).double().cuda()
    x = torch.randn(1, 48, 32, 32, dtype=torch.float64, device="cuda")
    want = layer(x)
    busy, other = torch.cuda.Stream(), torch.cuda.Stream()
    busy.wait_stream(torch.cuda.current_stream())
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(busy):
        torch.cuda._sleep(200_000_000)  # the first call's stream has queued work ahead of the preparation
        conv64.conv2d(x, layer)
    with torch.cuda.stream(other):
        got = conv64.conv2d(x, layer)  # the cached weights
    torch.cuda.synchronize()
    assert close(got, want)


@pytest.mark.gpu
def test_native_forward_takes_the_kernel_for_wide_layers(monkeypatch):
    """A prior-like stack through ``native_forward``: the wide layers go to conv64 (ReLUs fused), the narrow one to
    ATen, and the result is the modules' own forward up to float64 rounding; the setting turns the kernel off."""
    optional("triton")
    torch.manual_seed(1)
    stack = torch.nn.Sequential(torch.nn.Conv2d(52, 48, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.ConvTranspose2d(48, 64, 5, 2, 2, 1), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 2, 1)).double().cuda()
    x = torch.randn(2, 52, 40, 33, dtype=torch.float64, device="cuda")
    stack.requires_grad_(False)
    want = stack(x)
    assert conv64.available()  # its probe runs the real kernel, before the spies below
    calls = []
    for name in ("conv2d", "conv_transpose2d"):
        real = getattr(conv64, name)
        monkeypatch.setattr(conv64, name, lambda t, layer, relu, real=real, **head: calls.append((layer, relu)) or
                            real(t, layer, relu, **head))
    got = architectures.native_forward(stack, x, implicit_gemm=True)
    assert calls == [(stack[0], True), (stack[2], True)]
    assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())
    calls.clear()
    in_parts = architectures.native_forward(stack, (x[:, :48], x[:, 48:]), implicit_gemm=True)  # the prior's heads'
    assert calls == [(stack[0], True), (stack[2], True)]
    assert float((in_parts - want).abs().max()) <= 1e-12 * float(want.abs().max())
    calls.clear()
    with defaults.set(implicit_gemm=0):
        aten = architectures.native_forward(stack, x, implicit_gemm=True)
    assert calls == [] and float((aten - want).abs().max()) <= 1e-12 * float(want.abs().max())


def test_output_blocks():
    """A program's outputs: 48 as 32 + 16, no split where one power of two fits as well, several programs past 64."""
    assert conv64.n_blocks(48) == (32, 16) and conv64.n_blocks(40) == (32, 16)
    assert conv64.n_blocks(52) == (64, 0) and conv64.n_blocks(64) == (64, 0) and conv64.n_blocks(32) == (32, 0)
    assert conv64.n_blocks(1) == (16, 0) and conv64.n_blocks(20) == (32, 0) and conv64.n_blocks(128) == (64, 0)


@pytest.mark.gpu
def test_native_forward_fuses_a_heads_last_convolution(monkeypatch):
    """The residual prior's head (3 x 3, ReLU, 3 x 3, ReLU, 1 x 1 to two outputs) through ``native_forward``: the 1 x 1
    applied in the second convolution's kernel, the result the modules' own up to float64 rounding; HEAD_FUSION off,
    the 1 x 1 on ATen."""
    optional("triton")
    torch.manual_seed(5)
    head = torch.nn.Sequential(torch.nn.Conv2d(52, 48, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(48, 48, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(48, 2, 1)).double().cuda().requires_grad_(False)
    x = torch.randn(1, 52, 37, 45, dtype=torch.float64, device="cuda")
    want = head(x)
    assert conv64.available()
    for fusion in (True, False):
        monkeypatch.setattr(conv64, "HEAD_FUSION", fusion)
        calls = []
        real = conv64.conv2d
        monkeypatch.setattr(conv64, "conv2d", lambda t, layer, relu, head=None: calls.append(head) or
                            real(t, layer, relu, head=head))
        got = architectures.native_forward(head, (x[:, :48], x[:, 48:]), implicit_gemm=True)
        monkeypatch.setattr(conv64, "conv2d", real)
        assert calls == ([None, head[4]] if fusion else [None, None])
        assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())


@pytest.mark.gpu
def test_native_forward_takes_the_kernel_for_gdn(monkeypatch):
    """g_s's transposed convolution then IGDN through ``native_forward``: both on conv64, as the modules compute."""
    optional("triton")
    torch.manual_seed(2)
    stack = torch.nn.Sequential(torch.nn.ConvTranspose2d(48, 64, 5, 2, 2, 1).double().cuda(),
                                frozen_gdn(64, True, "cuda")).requires_grad_(False)
    x = torch.randn(1, 48, 21, 30, dtype=torch.float64, device="cuda")
    want = stack(x)
    assert conv64.available()
    calls = []
    real = conv64.gdn
    monkeypatch.setattr(conv64, "gdn", lambda *a: calls.append(a[3]) or real(*a))
    got = architectures.native_forward(stack, x, implicit_gemm=True)
    assert calls == [True]
    assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())


def test_layers_equal_torchs_in_tritons_interpreter():
    """The taps of every layer kind, run by Triton's interpreter on the CPU (the kernel as written, no GPU)."""
    optional("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = "from tests.test_conv64 import check_layers, check_prepared_weights as w; check_layers('cpu'); w('cpu')"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-3000:]


def test_native_forward_on_aten_equals_the_modules():
    """Every layer kind ``native_forward`` meets (strided and transposed convolutions, GDN both ways, ReLU) on ATen's
    kernels: the modules' own forward up to float64 rounding."""
    torch.manual_seed(4)
    stack = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 5, 2, 2), frozen_gdn(8, False, "cpu"),
                                torch.nn.ConvTranspose2d(8, 6, 5, 2, 2, 1), frozen_gdn(6, True, "cpu"), torch.nn.ReLU(),
                                torch.nn.Conv2d(6, 2, 1)).double().requires_grad_(False)
    x = torch.randn(2, 3, 12, 10, dtype=torch.float64)
    want, got = stack(x), architectures.native_forward(stack, x)
    assert got.shape == want.shape == (2, 2, 12, 10)
    assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())
    in_parts = architectures.native_forward(stack, (x[:, :1], x[:, 1:]))  # the input as two parts, concatenated
    assert float((in_parts - want).abs().max()) <= 1e-12 * float(want.abs().max())


def test_a_kernel_that_cannot_run_leaves_the_work_to_aten(monkeypatch):
    """Triton present but failing at its first launch (no C compiler for its launcher, an old driver): one warning
    naming the failure, and ``native_forward`` runs ATen's convolutions."""
    optional("triton")

    def broken():
        raise RuntimeError("Failed to find C compiler")

    monkeypatch.setattr(conv64, "_probe", broken)
    conv64.available.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="ATen's convolutions serve instead: RuntimeError: Failed to find C"):
            assert not conv64.available()
        assert not conv64.available()  # once: the answer is kept
    finally:
        conv64.available.cache_clear()


def test_a_layer_the_kernel_fails_on_runs_on_aten(monkeypatch):
    """A variant Triton cannot fit (more shared memory than the GPU has) where the probe's ran: one warning, that
    layer and the rest of the stack on ATen with the modules' values, the kernel off from then on."""
    optional("triton")
    from triton.runtime.errors import OutOfResources

    class Unfit:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise OutOfResources(147456, 101376, "shared memory")
            return launch

    monkeypatch.setattr(conv64, "_probe", lambda: None)
    monkeypatch.setattr(conv64, "_kernel", Unfit)
    monkeypatch.setattr(architectures, "implicit_gemm_on", lambda x: conv64.available())  # CPU tensors here
    conv64.available.cache_clear()
    torch.manual_seed(3)
    stack = torch.nn.Sequential(torch.nn.Conv2d(52, 48, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(48, 2, 1)).double().requires_grad_(False)
    x = torch.randn(1, 52, 9, 10, dtype=torch.float64)
    try:
        assert conv64.available()
        with pytest.warns(RuntimeWarning, match="failed on a layer, ATen's convolutions serve from now on: "
                                                "OutOfResources: out of resource: shared memory"):
            got = architectures.native_forward(stack, x, implicit_gemm=True)
        assert torch.allclose(got, stack(x), rtol=1e-12, atol=1e-12)
        assert not conv64.available()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(architectures.native_forward(stack, x, implicit_gemm=True), got)
    finally:
        conv64._TURNED_OFF.clear()
        conv64.available.cache_clear()


@torch.no_grad()
def check_prepared_weights(device: str) -> None:
    """A layer's weights are reshaped for the kernel once and reused; written in place, or replaced, they are made
    again: the next call computes with the new weights."""
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(5, 7, 3, padding=1).double().to(device)
    x = torch.randn(1, 5, 6, 7, dtype=torch.float64, device=device)
    assert close(conv64.conv2d(x, layer), layer(x))
    made = conv64._PREPARED[layer.weight]["taps"][1]
    assert close(conv64.conv2d(x, layer), layer(x)) and conv64._PREPARED[layer.weight]["taps"][1] is made
    layer.weight.mul_(-2)
    assert close(conv64.conv2d(x, layer), layer(x))
    layer.weight = torch.nn.Parameter(torch.randn_like(layer.weight))
    assert close(conv64.conv2d(x, layer), layer(x))
    with torch.inference_mode():  # the codec's mode: its model's weights are cached, a layer made here is not
        assert close(conv64.conv2d(x, layer), layer(x)) and layer.weight in conv64._PREPARED
        made_here = torch.nn.Conv2d(5, 7, 3, padding=1).double().to(device)
        assert close(conv64.conv2d(x, made_here), made_here(x)) and made_here.weight not in conv64._PREPARED
        made_here.weight.mul_(-2)
        assert close(conv64.conv2d(x, made_here), made_here(x))


@pytest.mark.gpu
def test_prepared_weights_follow_changes_on_the_gpu():
    optional("triton")
    check_prepared_weights("cuda")


@pytest.mark.gpu
def test_the_probe_passes_under_inference_mode():
    """The codec asks for the kernel inside ``torch.inference_mode``, where the probe's own layer is made."""
    optional("triton")
    conv64.available.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with torch.inference_mode():
                assert conv64.available()
    finally:
        conv64.available.cache_clear()
