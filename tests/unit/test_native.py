"""``rlonce.engine.fast.native``: the decode step's attention, rotary positions, RMSNorm and
``silu(gate) * up`` as C loops, against the same computed in float64 (attention also against
torch's float32 products: within twice their error), with masked columns, tails of fewer than 16
keys or values, the head sizes it is built for, cache views with spare columns, one and two
threads; what they refuse; a build that leaves nothing on disk."""

import shutil
import tempfile

import pytest
import torch

from rlonce.engine.fast import decode, native

FN = native.kernel()
needs_loop = pytest.mark.skipif(isinstance(FN, str), reason=f"no native kernels here: {FN}")


def _case(B, H, G, N, D, masked: bool, seed: int = 0):
    """Queries, cache views (buffers with 7 spare columns) and a (B, N) mask bias: left padding in
    row 0, a hole in the last row; the masked columns hold large values that must not leak."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, G, D, generator=g) * 0.4
    kb, vb = torch.randn(B, H, N + 7, D, generator=g), torch.randn(B, H, N + 7, D, generator=g)
    bias = None
    if masked:
        bias = torch.zeros(B, N)
        bias[0, :N // 2] = float("-inf")
        bias[-1, N // 3:N // 3 + 2] = float("-inf")
        bias[:, -1] = 0.0  # a row's own column is always attended
        dead = torch.isinf(bias)[:, None, :, None].expand(B, H, N, D)
        kb[:, :, :N][dead], vb[:, :, :N][dead] = 1e4, -1e4
    return q, kb[:, :, :N], vb[:, :, :N], bias


def _reference(q, keys, values, bias):
    s = q.double() @ keys.double().transpose(-1, -2)
    if bias is not None:
        s = s + bias.double()[:, None, None, :]
    return s.softmax(-1) @ values.double()


@needs_loop
@pytest.mark.parametrize("B,H,G,N,D", [(48, 2, 3, 130, 32), (5, 2, 3, 17, 32), (3, 3, 3, 16, 64), (2, 1, 7, 1, 128),
                                       (4, 2, 1, 33, 16), (2, 2, 2, 40, 48), (64, 2, 3, 200, 32)])
@pytest.mark.parametrize("masked", [True, False])
def test_the_loop_equals_attention_computed_in_float64(B, H, G, N, D, masked):
    q, keys, values, bias = _case(B, H, G, N, D, masked)
    want = _reference(q, keys, values, bias)
    got = native.attend(FN, q, keys, values, bias)
    assert got.shape == q.shape and got.dtype == torch.float32
    err = (got.double() - want).abs().max().item()
    assert err < 1e-5, err
    # torch's float32 products with the bias the step builds for them: the loop is about as close
    b_r1n = None if bias is None else bias[:, None, :].expand(B, H, N).reshape(B * H, 1, N)
    torch_err = (decode._attend(q.reshape(B * H, G, D), keys, values, b_r1n).view_as(q).double() - want).abs().max()
    assert err <= 2 * torch_err.item() + 1e-6, (err, torch_err.item())


@needs_loop
def test_one_and_two_threads_give_the_same_bits():
    q, keys, values, bias = _case(64, 2, 3, 150, 32, True, seed=3)  # large enough to split over threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.attend(FN, q, keys, values, bias)
        torch.set_num_threads(2)
        two = native.attend(FN, q, keys, values, bias)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_what_the_loop_does_not_take():
    q, keys, values, _ = _case(2, 2, 3, 10, 32, False)
    assert native.usable(q, keys, values)
    assert not native.usable(q.bfloat16(), keys.bfloat16(), values.bfloat16())  # bfloat16: torch's products
    q40, k40, v40, _ = _case(2, 2, 3, 10, 40, False)
    assert not native.usable(q40, k40, v40)  # a head size it is not built for
    assert not native.usable(q, keys.transpose(-1, -2).contiguous().transpose(-1, -2), values)
    assert not native.usable(q.transpose(1, 2), keys, values)


def test_a_build_leaves_nothing_on_disk_and_says_why_it_cannot(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    built = native._build()
    assert not isinstance(built, str) or "AVX-512" in built, built
    assert list(tmp_path.iterdir()) == []  # the library was loaded from a private directory, then removed
    monkeypatch.setattr(native, "compiler", lambda: None)
    assert native._build() == "no C compiler (cc, gcc or clang) on PATH"


@needs_loop
@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_each_compiler_builds_the_same_attention(monkeypatch, cc):
    """gcc builds it with OpenMP (torch's runtime), clang without: both compute the same thing."""
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    monkeypatch.setenv("CC", cc)
    fn = native._build()
    assert not isinstance(fn, str), fn
    q, keys, values, bias = _case(48, 2, 3, 77, 32, True, seed=5)
    got = native.attend(fn, q, keys, values, bias)
    assert (got.double() - _reference(q, keys, values, bias)).abs().max() < 1e-5


def test_a_compiler_that_fails_is_named_with_its_last_line(monkeypatch, tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'step.c:1: error: no such thing' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    assert native._build() == f"{fake} failed to build step.c: step.c:1: error: no such thing"


def _rotated(x, cos, sin, scale=1.0):
    """Rotary positions in float64: ``x * cos + rotate_half(x) * sin`` (as transformers' Llama)."""
    h = x.shape[-1] // 2
    x, cos, sin = x.double(), cos.double(), sin.double()
    return (x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin) * scale


@needs_loop
@pytest.mark.parametrize("B,H,G,N,D", [(48, 2, 3, 130, 32), (3, 3, 3, 16, 64), (2, 1, 7, 1, 128)])
def test_the_loop_rotates_the_queries_and_the_newest_key_first(B, H, G, N, D):
    """Given the rotary tables, the queries are rotated and scaled, and each row's last key is
    rotated in the cache itself (the step appends it as the projection gives it); the other
    columns stay as they were."""
    q, keys, values, bias = _case(B, H, G, N, D, True, seed=7)
    g = torch.Generator().manual_seed(8)
    angle = torch.rand(B, D // 2, generator=g) * 6
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    before = keys.clone()
    want_key = _rotated(keys[:, :, -1], cos[:, None], sin[:, None])
    got = native.attend(FN, q, keys, values, bias, (cos, sin, 0.25))
    assert (keys[:, :, -1].double() - want_key).abs().max() < 1e-5
    assert torch.equal(keys[:, :, :-1], before[:, :, :-1])
    want = _reference(_rotated(q, cos[:, None, None], sin[:, None, None], 0.25).float(), keys, values, bias)
    assert (got.double() - want).abs().max() < 1e-5


@needs_loop
@pytest.mark.parametrize("B,H,stride", [(41, 192, 192), (3, 40, 40), (5, 576, 1000), (400, 192, 192)])
def test_rms_norm_equals_float64(B, H, stride):
    """Rows of any width (a tail of fewer than 16), rows apart in a wider buffer, enough rows to split."""
    g = torch.Generator().manual_seed(B)
    x = torch.randn(B, stride, generator=g)[:, :H] * 3
    w = torch.rand(H, generator=g) + 0.5
    assert native.norm_usable(x, w)
    got = native.rms_norm(FN, x, w, 1e-5)
    xd = x.double()
    want = xd / (xd.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w.double()
    assert got.is_contiguous() and (got.double() - want).abs().max() < 1e-5


@needs_loop
@pytest.mark.parametrize("n", [7, 16 * 41 + 5, 512 * 200])
def test_silu_mul_equals_float64_in_place(n):
    """Large and small gates (no overflow at ±100), tails of fewer than 16, enough to split."""
    g = torch.Generator().manual_seed(n)
    gate, up = torch.randn(n, generator=g) * 8, torch.randn(n, generator=g)
    gate[:2] = torch.tensor([100.0, -100.0])
    want = gate.double() * torch.sigmoid(gate.double()) * up.double()
    assert native.silu_usable(gate, up)
    got = native.silu_mul(FN, gate, up)
    assert got.data_ptr() == gate.data_ptr() and torch.isfinite(got).all()
    assert ((got.double() - want).abs() / want.abs().clamp_min(1.0)).max() < 2e-6


def test_what_the_norm_and_activation_loops_do_not_take():
    x, w = torch.randn(4, 32), torch.ones(32)
    assert native.norm_usable(x, w)
    assert not native.norm_usable(x.bfloat16(), w.bfloat16())
    assert not native.norm_usable(x.t(), w)  # rows not contiguous
    assert not native.norm_usable(x[None], w)  # not rows
    gate, up = torch.randn(4, 64), torch.randn(4, 64)
    assert native.silu_usable(gate, up)
    assert not native.silu_usable(gate.bfloat16(), up.bfloat16())
    assert not native.silu_usable(gate.t(), up.t())
    assert not native.silu_usable(gate, up[:, :32])
