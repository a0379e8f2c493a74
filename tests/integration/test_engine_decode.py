"""The torch engine's written-out decode step and prefill (``rlonce.engine.fast.decode``) against
transformers' own forward: the same logits and the same cache after every step and prefill, on
the embedded model (Llama, grouped-query attention), a Qwen2 model (biased q/k/v projections) and
bfloat16 weights; left padding and holes masked; with ``rlonce.engine.fast.native``'s C loops (the
step's rotary positions and attention, norms and MLP activation; a prefill's norms and activation)
and with torch's operations; the engine's tokens and log-probs with the fast step on and off."""

import copy
import dataclasses
import re

import pytest
import torch
from conftest import gen_many

from rlonce.engine import forward, kvcache
from rlonce.engine.base import SamplingParams
from rlonce.engine.fast import decode, native
from rlonce.engine.torch_engine import TorchEngine
from rlonce.train.trainer import token_logprobs

KW = "cache"  # transformers 5: the cache argument (``past_key_values`` is deprecated)
PROMPTS = [[1, 50, 60, 70, 71, 72], [1, 80], [1, 90, 91, 92, 93, 94, 95, 96], [1, 100, 101]]


def _qwen2():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # the biased path is what this covers
    return model


def _steps(model, step, dense: bool, n: int = 5):
    """Prefill PROMPTS left-padded (a hole of two masked columns in row 0 unless ``dense``) with
    transformers' forward, then ``n`` steps with ``step`` on fixed tokens: logits per step, last keys."""
    from rlonce.engine.rows import left_pad

    prompts = [p[:2] for p in PROMPTS] if dense else PROMPTS
    ids, attn, pos = left_pad(prompts, 0)
    if not dense:
        attn[0, -4:-2] = 0  # a hole, as a row prefilled after a kept cache has
    cache = kvcache.new_cache()
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **{KW: cache})
        out, pos = [], pos[:, -1:]
        for i in range(n):
            nxt = torch.arange(len(prompts))[:, None] * 7 + 20 + i
            attn, pos = torch.cat([attn, torch.ones_like(nxt)], 1), pos + 1
            logits = step(nxt, pos, cache, None if dense else attn)
            out.append(logits.float())
    return torch.stack(out), cache.layers[-1].keys.float()


@pytest.mark.fast_path
@pytest.mark.parametrize("which", ["embedded", "qwen2", "embedded-bf16"])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("native_kernels", [True, False])
def test_the_written_out_step_equals_transformers_forward(lm, which, dense, native_kernels):
    model = _qwen2() if which == "qwen2" else copy.deepcopy(lm.model).eval()
    if which.endswith("bf16"):
        model = model.to(torch.bfloat16)
    assert decode.why_not(model) is None
    fast, generic = forward.stepper(model, KW, native_kernels=native_kernels), forward.stepper(model, KW, fast=False)
    assert isinstance(fast, decode.FastDecode) and not isinstance(generic, decode.FastDecode)
    assert (fast.kernel is not None) == (native_kernels and not isinstance(native.kernel(), str))
    got, got_keys = _steps(model, fast, dense)
    want, want_keys = _steps(model, generic, dense)
    assert torch.isfinite(got).all()
    if which.endswith("bf16"):  # both round to bfloat16 in different places: neither is further from float32
        ref_model = copy.deepcopy(lm.model).eval()
        ref, ref_keys = _steps(ref_model, forward.stepper(ref_model, KW, fast=False), dense)
        err, base = (got - ref).abs().mean(), (want - ref).abs().mean()
        assert err < 1.5 * base + 1e-3, (err, base)
        assert (got_keys - ref_keys).abs().mean() < 1.5 * (want_keys - ref_keys).abs().mean() + 1e-3
    else:
        assert (got - want).abs().max() < 2e-5, (got - want).abs().max()
        assert torch.allclose(got_keys, want_keys, atol=2e-5)


def _prefills(model, fwd):
    """PROMPTS left-padded from nothing, then new tokens of different lengths after that cache
    (left-padded again: a masked hole between each row's kept columns and its new ones), with
    ``fwd.prefill``: the logits of both calls, and every layer's keys where attended."""
    from rlonce.engine.rows import left_pad

    ids, attn, pos = left_pad(PROMPTS, 0)
    new = [[30 + i + j for j in range(1 + 2 * i)] for i in range(len(PROMPTS))]
    ids2, attn2, pos2 = left_pad(new, 0)
    pos2 = pos2 + attn.sum(1, keepdim=True)
    cache = fwd.new_cache()
    with torch.inference_mode():
        first = fwd.prefill(ids, pos, cache, attn)
        attn = torch.cat([attn, attn2], 1)
        second = fwd.prefill(ids2, pos2, cache, attn)
    keys = torch.stack([layer.keys.float() * attn[:, None, :, None] for layer in cache.layers])
    return torch.cat([first, second]).float(), keys


@pytest.mark.parametrize("which", ["embedded", "qwen2", "embedded-bf16"])
@pytest.mark.parametrize("native_kernels", [True, False])
def test_the_written_out_prefill_equals_transformers_forward(lm, which, native_kernels):
    """The written-out prefill (its last layer at each row's last position only) against
    transformers' forward: the same next-token logits, the same keys in every attended column."""
    model = _qwen2() if which == "qwen2" else copy.deepcopy(lm.model).eval()
    if which.endswith("bf16"):
        model = model.to(torch.bfloat16)
    got, got_keys = _prefills(model, forward.stepper(model, KW, native_kernels=native_kernels))
    want, want_keys = _prefills(model, forward.stepper(model, KW, fast=False))
    assert torch.isfinite(got).all() and torch.isfinite(got_keys).all()
    if which.endswith("bf16"):
        ref_model = copy.deepcopy(lm.model).eval()
        ref, ref_keys = _prefills(ref_model, forward.stepper(ref_model, KW, fast=False))
        assert (got - ref).abs().mean() < 1.5 * (want - ref).abs().mean() + 1e-3
        assert (got_keys - ref_keys).abs().mean() < 1.5 * (want_keys - ref_keys).abs().mean() + 1e-3
    else:
        assert (got - want).abs().max() < 2e-5, (got - want).abs().max()
        assert torch.allclose(got_keys, want_keys, atol=2e-5)


@pytest.mark.fast_path
def test_the_engine_samples_the_same_with_the_fast_step_and_without(lm):
    """Seeded sampling through the engine: the same tokens, log-probs within float32 rounding of
    each other and of the trainer's recomputation."""
    gens = {}
    for fast in (True, False):
        eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0,
                          max_batch_size=16, batch_wait_s=0.05, fast_decode=fast)
        try:
            assert isinstance(eng._fwd, decode.FastDecode) == fast
            gens[fast] = gen_many(eng, PROMPTS, [SamplingParams(max_tokens=16, seed=i) for i in range(len(PROMPTS))])
        finally:
            eng.close()
    for p, a, b in zip(PROMPTS, gens[True], gens[False]):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        ids = torch.tensor([p + a.token_ids])
        lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids))
        assert torch.allclose(lp[0, len(p) - 1:], torch.tensor(a.logprobs), atol=2e-4)


def test_other_architectures_take_transformers_forward(lm):
    from transformers import AutoConfig, AutoModelForCausalLM

    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", vocab_size=300, n_embd=32, n_layer=1,
                                                                 n_head=2, n_positions=64)).eval()
    assert "gpt2" in decode.why_not(gpt2)
    assert not isinstance(forward.stepper(gpt2, KW), decode.FastDecode)
    eng = TorchEngine(gpt2, eos_token_ids=[], pad_token_id=0, max_batch_size=4, batch_wait_s=0.01)
    try:
        g = gen_many(eng, [[5, 6, 7]], [SamplingParams(max_tokens=4, seed=0)])[0]
    finally:
        eng.close()
    assert len(g.token_ids) == 4


@pytest.mark.fast_path
def test_the_fast_path_is_taken_only_after_its_parity_check_and_one_switch_turns_it_off(lm, monkeypatch):
    """``engine.fast_path``: the engine checks the written-out step against transformers' forward on
    its own model before decoding through it; a step that disagrees (here: RMSNorm off by 0.1 %)
    is not taken, and the engine runs the reference and says why."""
    from rlonce.engine.factory import EngineSpec

    model = copy.deepcopy(lm.model).eval()
    fast = forward.stepper(model, KW)
    assert isinstance(fast, decode.FastDecode) and fast.status.startswith("fast path: parity ok")
    off = forward.stepper(model, KW, fast=False)
    assert isinstance(off, forward.Generic) and "engine.fast_path is false" in off.status
    spec = EngineSpec(backend="torch", model_dir=str(lm.path), fast_path=False, compile_solo=True)
    eng = spec.build(lm=dataclasses.replace(lm, model=copy.deepcopy(lm.model)))
    try:
        assert isinstance(eng._fwd, forward.Generic) and eng.solo is None  # one switch: compiled solo too
    finally:
        eng.close()
    norm = decode.FastDecode._norm
    monkeypatch.setattr(decode.FastDecode, "_norm", lambda self, x, m: norm(self, x, m) * 1.001)
    broken = forward.stepper(model, KW)
    assert isinstance(broken, forward.Generic)
    assert re.search(r"parity FAILED .*\(logits \S+, cached keys \S+ relative; tolerance 1e-05\)$", broken.status)
    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0)
    try:
        assert isinstance(eng._fwd, forward.Generic) and "parity FAILED" in eng.fast_path
        g = gen_many(eng, PROMPTS[:1], [SamplingParams(max_tokens=4, seed=0)])[0]  # the reference decodes
        assert len(g.token_ids) == 4
    finally:
        eng.close()


@pytest.mark.fast_path
def test_doctor_shows_the_fast_paths_parity_on_the_jobs_model(tmp_path):
    from rlonce.cli.doctor import check_fast_path
    from rlonce.config import load_config

    checks = check_fast_path(load_config(None, [f"out={tmp_path / 'run'}"]))
    assert checks[-1].ok and re.search(r"^embedded: fast path: parity ok with (C loops|torch's operations) \(logits",
                                       checks[-1].detail), checks[-1].detail
    (off,) = check_fast_path(load_config(None, [f"out={tmp_path / 'run'}", "engine.fast_path=false"]))
    assert off.ok and "engine.fast_path is false" in off.detail


def test_few_float32_rows_run_flipped_and_equal_the_plain_product():
    """``decode._flipped``: at most ``FLIP_ROWS`` float32 rows outside autocast run as ``(W·xᵀ)ᵀ``;
    the products, the residual add and the LM head equal the plain ones to float32 rounding, and
    come out contiguous."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    plain, biased = torch.nn.Linear(48, 40, bias=False), torch.nn.Linear(48, 40)
    x = torch.randn(decode.FLIP_ROWS, 48)
    assert decode._flipped(x, plain.weight) and decode._flipped(x[:1], plain.weight)
    assert not decode._flipped(torch.randn(decode.FLIP_ROWS + 1, 48), plain.weight)
    assert not decode._flipped(x.bfloat16(), plain.weight.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not decode._flipped(x, plain.weight)
    with torch.inference_mode():
        for m in (plain, biased):
            got = decode._linear(x, m)
            want = F.linear(x.double(), m.weight.double(), None if m.bias is None else m.bias.double())
            assert got.is_contiguous() and got.dtype == torch.float32
            assert (got.double() - want).abs().max() < 1e-5
        r = torch.randn(decode.FLIP_ROWS, 40)
        got = decode._residual(r, x, plain)
        want = r.double() + x.double() @ plain.weight.double().T
        assert got.is_contiguous() and (got.double() - want).abs().max() < 1e-5

        class Tiny(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lm_head = torch.nn.Linear(48, 300, bias=False)

        tiny = Tiny()
        head = decode._head(tiny, x)
        assert head.is_contiguous() and (head - tiny.lm_head(x)).abs().max() < 1e-5


def test_the_environment_turns_the_fast_path_off_for_the_whole_process(lm, monkeypatch):
    """``RLONCE_FAST_PATH=off`` (``make test-reference``): the reference forward, and no compiled
    solo, whatever the engine was asked for; the status names the variable."""
    monkeypatch.setenv(forward.OFF_ENV, "off")
    ref = forward.stepper(copy.deepcopy(lm.model).eval(), KW)
    assert isinstance(ref, forward.Generic) and ref.status.endswith("RLONCE_FAST_PATH=off")
    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0, compile_solo=True)
    try:
        assert isinstance(eng._fwd, forward.Generic) and eng.solo is None
        assert "RLONCE_FAST_PATH=off" in eng.fast_path
    finally:
        eng.close()
