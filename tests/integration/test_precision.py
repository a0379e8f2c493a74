"""``model.autocast``: bfloat16 products in the engine and the trainer, float32 weights and head."""

import asyncio
import copy

import torch

from rlonce.engine.base import SamplingParams
from rlonce.engine.torch_engine import TorchEngine
from rlonce.model import precision
from rlonce.train.trainer import token_logprobs

PROMPT = [1, 50, 60, 70, 80, 90]


def test_the_setting_resolves_against_the_cpus_flags():
    assert precision.wants_autocast("bfloat16") and not precision.wants_autocast("off")
    assert precision.wants_autocast("auto") == precision.bf16_units()


def test_autocast_runs_products_in_bfloat16_and_keeps_weights_and_head_in_float32(lm):
    model = copy.deepcopy(lm.model)
    precision.use_autocast(model)
    eng = TorchEngine(copy.deepcopy(model), eos_token_ids=[], pad_token_id=0, seed=0)
    try:
        g = asyncio.run(eng.generate(PROMPT, SamplingParams(max_tokens=16, seed=1)))
        (entry,) = eng.prefixes._entries.values()
        assert entry.kv[0][1].dtype == torch.bfloat16  # the values came out of a bfloat16 product
    finally:
        eng.close()
    ids = torch.tensor([PROMPT + g.token_ids])
    ones = torch.ones_like(ids)
    with precision.autocast(model):
        assert model(input_ids=ids).logits.dtype == torch.float32  # the head: float32
    lp_amp, _ = token_logprobs(model, ids, ones)
    lp_fp32, _ = token_logprobs(lm.model, ids, ones)
    engine_lp = torch.tensor(g.logprobs)
    amp = lp_amp[0, len(PROMPT) - 1:]
    # engine and trainer both in bfloat16: close, though not as close as in float32 (2e-4)
    assert torch.allclose(amp, engine_lp, atol=0.1), (amp - engine_lp).abs().max()
    assert (amp - lp_fp32[0, len(PROMPT) - 1:]).abs().max() > 1e-5  # bfloat16 did run
    loss = -lp_amp.sum()
    loss.backward()
    p = next(model.parameters())
    assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
