"""``rlonce.engine.native``: the decode step's attention as a C loop, against the same attention in
float64 (and against torch's float32 products: within twice their error), with masked
columns, tails of fewer than 16 keys, the head sizes it is built for, cache views with spare
columns, one and two threads; what it refuses; a build that leaves nothing on disk."""

import shutil
import tempfile

import pytest
import torch

from rlonce.engine import decode, native

FN = native.kernel()
needs_loop = pytest.mark.skipif(isinstance(FN, str), reason=f"no native attention here: {FN}")


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
    fake.write_text("#!/bin/sh\necho 'attend.c:1: error: no such thing' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    assert native._build() == f"{fake} failed to build attend.c: attend.c:1: error: no such thing"
