"""The vLLM engine on the embedded model: log-probs against the trainer, weight loads, pause,
seeds, the stop rule, and rollouts through the gateway.

The GPU tests need a CUDA device and vLLM (``pip install 'rlonce[vllm]'``); run them with
``make test-gpu``. The two CPU tests check what works without either: the module imports, says
how to install vLLM, and weights travel to the workers as exact bytes.
"""

import asyncio
import copy
import importlib.util

import pytest
import torch
from conftest import gen_many

from rlonce.engine.base import SamplingParams
from rlonce.engine.torch_engine import process_logits
from rlonce.engine.vllm_engine import pack_tensors, unpack_tensor
from rlonce.train.trainer import token_logprobs

HAS_VLLM = importlib.util.find_spec("vllm") is not None
WHY_NOT = ("no CUDA device (torch.cuda.is_available() is False)" if not torch.cuda.is_available()
           else "vLLM is not installed: pip install 'rlonce[vllm]'" if not HAS_VLLM else "")
needs_gpu = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)

PROMPTS = [[1, 50, 60, 70], [1, 80], [1, 90, 91, 92, 93, 94, 95], [1, 100, 101]]
ATOL = 2e-3
"""float32 on both sides; only the kernels differ (vLLM's attention vs the eager Hugging Face one)."""


@pytest.fixture(scope="module")
def engine(embedded_dir, lm):
    from rlonce.engine.vllm_engine import VLLMEngine

    eng = VLLMEngine(embedded_dir, dtype="float32", gpu_memory_utilization=0.3, max_model_len=1024, seed=0,
                     enforce_eager=True, eos_token_ids=lm.eos_token_ids)
    yield eng
    eng.close()


def recomputed(model, prompt, token_ids, temperature=1.0):
    """The trainer's log-probs of ``token_ids`` generated after ``prompt``."""
    ids = torch.tensor([prompt + token_ids])
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return lp[0, len(prompt) - 1:]


# ---- without a GPU -------------------------------------------------------------------------------

def test_the_module_imports_without_vllm_and_says_how_to_install_it():
    if HAS_VLLM:
        pytest.skip("vLLM is installed here")
    from rlonce.engine.vllm_engine import VLLMEngine

    with pytest.raises(ImportError, match=r"pip install 'rlonce\[vllm\]'") as e:
        VLLMEngine("unused")
    assert "\n" not in str(e.value)


def test_the_engines_head_follows_the_trainers_precision():
    from rlonce.engine.factory import EngineSpec
    from rlonce.engine.vllm_engine import head_overrides

    # bf16 weights with the fp32 head (the default, as the trainer loads them): vLLM's head_dtype knob
    assert head_overrides("bfloat16", True) == {"head_dtype": "float32"}
    assert head_overrides("bfloat16", True, {"max_position_embeddings": 4096}) == {
        "max_position_embeddings": 4096, "head_dtype": "float32"}
    # float32 weights, or the option off: nothing to override (the trainer's head is then in the weights' dtype)
    assert head_overrides("float32", True) is None and head_overrides("bfloat16", False) is None
    # the spec carries model.lm_head_fp32 to the engine
    assert EngineSpec(backend="vllm", model_dir="m", dtype="bfloat16").lm_head_fp32


def test_weights_travel_to_the_workers_as_exact_bytes():
    assert pack_tensors({"x": torch.tensor([1.0])}) == [[("x", "float32", [1], b"\x00\x00\x80?")]]  # IEEE 754 1.0
    emb = torch.randn(10, 4)
    state = {"model.embed_tokens.weight": emb, "lm_head.weight": emb,  # tied: one storage, two names
             "bf16": torch.randn(3, 5).bfloat16(), "transposed": torch.randn(4, 6).t(), "scalar": torch.tensor(3.5),
             "ids": torch.arange(7), "empty": torch.empty(0, 3)}
    chunks = pack_tensors(state, chunk_bytes=100)
    assert all(len(c) == 1 or sum(len(e[3]) for e in c) <= 100 for c in chunks) and len(chunks) >= 3
    flat = [e for c in chunks for e in c]
    assert [e[0] for e in flat] == list(state)
    for name, dtype, shape, raw in flat:
        t = unpack_tensor(dtype, shape, raw)
        assert t.dtype == state[name].dtype and torch.equal(t, state[name]), name
    assert pack_tensors({}) == []


def test_packed_weights_are_plain_msgpack_data():
    """vLLM's utility channel is msgpack: tuples come back as lists, bytes as bytes."""
    msgpack = pytest.importorskip("msgpack")
    state = {"w": torch.randn(3, 2).bfloat16()}
    (chunk,) = msgpack.unpackb(msgpack.packb(pack_tensors(state)))
    name, dtype, shape, raw = chunk[0]
    assert name == "w" and torch.equal(unpack_tensor(dtype, shape, raw), state["w"])


# ---- on a GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_the_trainers_recomputation(engine, lm, temperature):
    gens = gen_many(engine, PROMPTS, [SamplingParams(max_tokens=12, temperature=temperature, seed=i)
                                      for i in range(4)])
    for p, g in zip(PROMPTS, gens):
        assert torch.allclose(recomputed(lm.model, p, g.token_ids, temperature), torch.tensor(g.logprobs), atol=ATOL), g
        assert g.versions == [engine.version] * len(g.token_ids) and 1 <= len(g.token_ids) <= 12
        assert g.finish_reason in {"stop", "length"}
        assert g.finish_reason == "length" or g.token_ids[-1] in lm.eos_token_ids  # EOS is part of the turn


@pytest.mark.gpu
@needs_gpu
def test_top_k_and_top_p_logprobs_are_of_the_processed_distribution(engine, lm):
    """Same processing as TorchEngine (temperature, top-k, top-p). A position whose cut-off is a
    near-tie may keep a different set in float32; one such position is tolerated."""
    s = [SamplingParams(max_tokens=12, temperature=0.7, top_k=20, top_p=0.9, seed=i) for i in range(4)]
    off = 0
    for p, g in zip(PROMPTS, gen_many(engine, PROMPTS, s)):
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([p + g.token_ids])).logits[0, len(p) - 1:-1]
        n = len(logits)
        logp = process_logits(logits, torch.full((n,), 0.7), torch.full((n,), 20), torch.full((n,), 0.9))
        want = logp.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        off += int(((want - torch.tensor(g.logprobs)).abs() > ATOL).sum())
    assert off <= 1
    greedy = gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=6, top_k=1)])[0]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([PROMPTS[0] + greedy.token_ids])).logits[0]
    assert greedy.token_ids == logits[len(PROMPTS[0]) - 1:-1].argmax(-1).tolist()
    assert greedy.logprobs == pytest.approx([0.0] * len(greedy.token_ids), abs=1e-6)  # one candidate


@pytest.mark.gpu
@needs_gpu
def test_candidate_set_sizes_let_the_trainer_renormalise(engine, lm):
    """Under top-p (and top-k) vLLM records each token's candidate-set size, the sizes the torch
    processing keeps, and the trainer's log-probs over those sets are vLLM's (one near-tie tolerated)."""
    s = [SamplingParams(max_tokens=12, temperature=0.7, top_k=k, top_p=0.9, seed=i) for i, k in enumerate((0, 5, 0, 5))]
    off = 0
    for p, g, si in zip(PROMPTS, gen_many(engine, PROMPTS, s), s):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = lm.model(input_ids=ids).logits[0, len(p) - 1:-1]
            n = len(logits)
            keep = process_logits(logits, torch.full((n,), 0.7), torch.full((n,), si.top_k), torch.full((n,), 0.9))
            cand = torch.tensor([[0] * (len(p) - 1) + g.candidates])
            lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids), temperature=0.7, cand_BT=cand)
        assert g.metrics["candidate_sets_unknown"] == 0 and len(g.candidates) == len(g.token_ids)
        off += sum(a != b for a, b in zip(keep.isfinite().sum(-1).tolist(), g.candidates))
        off += int(((lp[0, len(p) - 1:] - torch.tensor(g.logprobs)).abs() > ATOL).sum())
    assert off <= 1


@pytest.mark.gpu
@needs_gpu
def test_seeded_requests_are_reproducible_and_do_not_depend_on_batch_company(engine):
    alone = gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=16, seed=7)])[0]
    again = gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=16, seed=7)])[0]
    crowd = gen_many(engine, PROMPTS, [SamplingParams(max_tokens=16, seed=s) for s in (7, 1, 2, 3)])[0]
    assert alone.token_ids == again.token_ids == crowd.token_ids
    assert alone.logprobs == pytest.approx(crowd.logprobs, abs=ATOL)


@pytest.mark.gpu
@needs_gpu
def test_confident_run_stop_rule(engine):
    """Greedy decoding samples every token with p = 1 > 0.99: a run limit of 5 ends the turn after
    exactly 5 tokens with finish reason 'repetition'; the other request is unaffected."""
    g, free = gen_many(engine, PROMPTS[:2], [SamplingParams(max_tokens=40, top_k=1, stop_confident_run=5),
                                             SamplingParams(max_tokens=40, top_k=1, seed=1)])
    assert (g.finish_reason, len(g.token_ids), len(g.logprobs), len(g.versions)) == ("repetition", 5, 5, 5)
    assert free.finish_reason in {"stop", "length"}


@pytest.mark.gpu
@needs_gpu
def test_load_weights_changes_outputs_stamps_the_version_and_resets_the_prefix_cache(engine, lm, tmp_path):
    prompt = [1] + list(range(200, 499))  # 300 tokens: full KV-cache blocks whatever the block size
    greedy = SamplingParams(max_tokens=8, top_k=1)
    gen_many(engine, [prompt], [greedy])
    warm = gen_many(engine, [prompt], [greedy])[0]
    assert warm.metrics["cached_prompt_tokens"] > 0  # prefix caching is on
    other = copy.deepcopy(lm.model)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():  # tied embeddings stay tied
            p.add_(0.02 * torch.randn(p.shape, generator=noise))
    v = engine.version
    try:
        engine.load_weights(other.state_dict(), v + 5)
        after = gen_many(engine, [prompt], [greedy])[0]
        assert after.metrics["cached_prompt_tokens"] == 0  # KV computed by the old weights is gone
        assert engine.version == v + 5 and after.versions == [v + 5] * len(after.token_ids)
        sampled = gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=12, seed=3)])[0]
        lp = torch.tensor(sampled.logprobs)
        assert torch.allclose(recomputed(other, PROMPTS[0], sampled.token_ids), lp, atol=ATOL)
        assert not torch.allclose(recomputed(lm.model, PROMPTS[0], sampled.token_ids), lp, atol=ATOL)
        other.save_pretrained(tmp_path / "ckpt")  # the same weights as a safetensors folder
        engine.load_weights(lm.model.state_dict(), v + 6)
        engine.load_weights(tmp_path / "ckpt", v + 7)
        again = gen_many(engine, [prompt], [greedy])[0]
        assert (again.token_ids, again.versions) == (after.token_ids, [v + 7] * len(after.token_ids))
    finally:
        engine.load_weights(lm.model.state_dict(), v + 8)


@pytest.mark.gpu
@needs_gpu
def test_load_weights_refuses_while_requests_run_unpaused(engine, lm):
    async def go():
        task = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_tokens=200, seed=0)))
        await asyncio.sleep(0)  # generate() hands the request to the engine's loop
        with pytest.raises(RuntimeError, match="pause"):
            engine.load_weights(lm.model.state_dict(), engine.version + 1)
        return await task

    v = engine.version
    g = asyncio.run(go())
    assert engine.version == v and g.versions == [v] * len(g.token_ids)


@pytest.mark.gpu
@needs_gpu
def test_pause_aborts_in_flight_requests_and_resume_continues_under_the_new_version(engine, lm):
    """The GRPO step: pause mid-generation, load weights, resume; every aborted turn is continued
    the way the gateway session does it (prompt + tokens so far)."""
    prompts = [[1] + list(range(100 + 11 * i, 140 + 11 * i)) for i in range(32)]
    v = engine.version

    async def go():
        tasks = [asyncio.ensure_future(engine.generate(p, SamplingParams(max_tokens=900, seed=i)))
                 for i, p in enumerate(prompts)]
        await asyncio.sleep(0.1)
        engine.pause()
        first = await asyncio.gather(*tasks)
        held = asyncio.ensure_future(engine.generate(prompts[0], SamplingParams(max_tokens=4, seed=0)))
        await asyncio.sleep(0.3)
        was_held = not held.done()
        engine.load_weights(lm.model.state_dict(), v + 1)  # the same weights under a new version
        engine.resume()
        cut = [(p, g) for p, g in zip(prompts, first) if g.finish_reason == "abort"]
        more = await asyncio.gather(*(engine.generate(p + g.token_ids, SamplingParams(max_tokens=8, seed=j))
                                      for j, (p, g) in enumerate(cut)))
        return first, was_held, await held, cut, more

    first, was_held, held, cut, more = asyncio.run(go())
    assert was_held and held.versions == [v + 1] * len(held.token_ids)
    assert cut, "every request ended before the pause"
    for g in first:
        assert len(g.token_ids) == len(g.logprobs) == len(g.versions) < 900
        assert g.versions == [v] * len(g.token_ids) and g.finish_reason in {"abort", "stop", "length"}
    for (p, g), m in zip(cut, more):
        assert m.versions == [v + 1] * len(m.token_ids) and m.token_ids
        assert torch.allclose(recomputed(lm.model, p, g.token_ids + m.token_ids), torch.tensor(g.logprobs + m.logprobs),
                              atol=ATOL)


@pytest.mark.gpu
@needs_gpu
def test_reasoning_rollouts_through_the_gateway_record_what_vllm_sampled(engine, lm):
    """Single-turn reasoning episodes through rollout.collect and the gateway: every trained token
    carries vLLM's log-prob, equal to the trainer's, and the engine's version."""
    from rlonce.config import load_config
    from rlonce.core.records import sequence_to_rows
    from rlonce.envs.domains import domain_for
    from rlonce.harness.loop import HarnessLimits
    from rlonce.model.chat import get_format
    from rlonce.rollout.runner import RolloutSpec, collect

    options = "task.options={chain_sum = {min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 2}}"
    cfg = load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0", options])
    domain = domain_for(cfg.task)
    spec = RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=get_format("hermes"),
                       sampling=SamplingParams(max_tokens=32), limits=HarnessLimits(), arms=("single-turn",))
    tasks = [domain.task("train", i) for i in range(2)]
    samples = asyncio.run(collect(tasks, 2, domain.env_factory, engine, spec, progress=False, seed=0))
    seqs = [s for x in samples for s in x.sequences]
    assert len(seqs) == 4 and not any(s.infra_failed for s in seqs), [s.status for s in seqs]
    for s in seqs:
        for row in sequence_to_rows(s, 1.0):
            ids = torch.tensor([row.token_ids])
            lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids))
            mask = torch.tensor(row.loss_mask[1:]).bool()
            assert mask.any()
            assert torch.allclose(lp[0][mask], torch.tensor(row.rollout_logprobs[1:])[mask], atol=ATOL)
            assert {v for v, m in zip(row.policy_versions, row.loss_mask) if m} == {engine.version}
