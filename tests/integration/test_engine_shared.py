"""A prefix several new prompts share (a system prompt) is prefilled once and kept before their
batch runs; equal prompts run once among kept-prefix requests too (``rlonce.engine.prefill``)."""

import copy

import torch
from conftest import gen_many

from rlonce.engine import prefill
from rlonce.engine.base import SamplingParams
from rlonce.engine.torch_engine import TorchEngine
from rlonce.train.trainer import token_logprobs

SYSTEM = [1] + list(range(40, 60))  # 21 tokens every prompt starts with
PROMPTS = [SYSTEM + [300, 301, 302], SYSTEM + [310], SYSTEM + [320, 321], SYSTEM + [300, 301, 302]]


def test_dedupe_and_shared_prefixes_by_hand():
    first, of, reused = prefill.dedupe([[1, 2], [3], [1, 2], [1, 2, 4]], [0, 0, 0, 0])
    assert first == [0, 1, 3] and of == [0, 1, 0, 2] and reused == [0, 0, 2, 0]
    assert prefill.dedupe([[1], [2]], [5, 6]) == ([0, 1], None, [5, 6])
    a, b, c, d = [1] * 20 + [2], [1] * 20 + [3, 3], [1] * 18 + [4], [9] * 30
    assert prefill.shared_prefixes([a, b, c, d, a], min_len=16) == [[1] * 18]  # a, b, c: the 18 all three share
    assert prefill.shared_prefixes([a, b, d], min_len=16) == [[1] * 20]
    assert prefill.shared_prefixes([a, d], min_len=16) == []  # nothing shared
    assert prefill.shared_prefixes([a, a], min_len=16) == []  # equal prompts are dedupe's
    assert prefill.shared_prefixes([[1] * 17, [1] * 17 + [5]], min_len=16) == [[1] * 17]  # a whole prompt
    assert prefill.common_length([1, 2, 3], [1, 2]) == 2 and prefill.common_length([], [1]) == 0


def test_a_shared_system_prompt_runs_once_and_the_logprobs_stay_the_trainers(lm):
    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=16,
                      batch_wait_s=0.05)
    try:
        gens = gen_many(eng, PROMPTS, [SamplingParams(max_tokens=8, seed=i) for i in range(4)])
        stats = eng.stats
    finally:
        eng.close()
    assert stats["waves"] == 1
    # the system prompt once, then each distinct prompt's own tokens; the duplicate runs none
    assert stats["prefill_tokens"] == len(SYSTEM) + 3 + 1 + 2
    # the first reader of the system prompt ran it (charged to it), the others read it, the duplicate ran nothing
    assert [g.metrics["cached_prompt_tokens"] for g in gens] == [0, len(SYSTEM), len(SYSTEM), len(PROMPTS[3])]
    for p, g in zip(PROMPTS, gens):
        ids = torch.tensor([p + g.token_ids])
        lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids))
        assert torch.allclose(lp[0, len(p) - 1:], torch.tensor(g.logprobs), atol=2e-4)


def test_without_a_prefix_store_nothing_is_kept_and_equal_prompts_still_run_once(lm):
    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=16,
                      batch_wait_s=0.05, prefix_cache_mb=0)
    try:
        gen_many(eng, PROMPTS, [SamplingParams(max_tokens=4, seed=i) for i in range(4)])
        assert eng.stats["prefill_tokens"] == sum(len(p) for p in PROMPTS[:3])
    finally:
        eng.close()


def test_a_store_too_small_for_the_shared_prefix_runs_no_extra_forward(lm):
    """The shared prefix is not run on its own when the store could not keep it: every admission
    would otherwise run and throw it away."""
    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=16,
                      batch_wait_s=0.05, prefix_cache_mb=0.001)  # ~1 KB: not even the system prompt fits
    try:
        gens = gen_many(eng, PROMPTS, [SamplingParams(max_tokens=4, seed=i) for i in range(4)])
        assert eng.stats["prefill_tokens"] == sum(len(p) for p in PROMPTS[:3])
        assert eng.stats["prefix_stored"] == 0 and [g.metrics["cached_prompt_tokens"] for g in gens] == \
            [0, 0, 0, len(PROMPTS[3])]
    finally:
        eng.close()


def test_charge_by_hand():
    kept, unread = prefill.charge([[1, 2, 3]], [[9, 9], [1, 2, 3, 4], [1, 2, 3, 5]], [0, 3, 3])
    assert kept == [0, 0, 3] and unread == 0
    assert prefill.charge([[7, 7]], [[1, 2]], [0]) == ([0], 2)
