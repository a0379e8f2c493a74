"""Routing replay (R3) on a real sparse model: the torch engine records each token's experts, the
trainer's forward replays them, and the step reports expert load; router freezing.

The model is a small randomly initialised Qwen3-MoE (transformers' own architecture, 4 experts,
top-2, 2 layers), so the routers' choices are real top-k decisions over real logits."""

import asyncio
import dataclasses
import math

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from rlonce.core.records import (
    Context,
    Role,
    Segment,
    Sequence,
    TrainingRow,
    sequence_from_dict,
    sequence_to_dict,
    sequence_to_rows,
)
from rlonce.engine.base import SamplingParams
from rlonce.engine.forward import cache_keyword
from rlonce.engine.torch_engine import TorchEngine
from rlonce.model import moe
from rlonce.train.request import RLRequest
from rlonce.train.trainer import OptimSettings, Trainer

VOCAB = 64


def tiny_moe(seed: int = 0, vocab: int = VOCAB):
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=vocab, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=64,
                               moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                               max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # spread the routers' logits: the default init leaves them near zero
        for gate in moe.routers(model):
            gate.weight.normal_(0, 0.5)
    return model.eval()


def own_routes(model, ids: list[int]) -> np.ndarray:
    """The experts ``model``'s routers pick for ``ids`` in one plain forward: (len, layers, k)."""
    moe.install(model)
    with torch.no_grad(), moe.recording() as rec:
        model(input_ids=torch.tensor([ids]))
        return rec.take(1, len(ids))[0]


def same_sets(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.sort(a.astype(np.int64), -1) == np.sort(b.astype(np.int64), -1)).all(-1)


@pytest.fixture(scope="module")
def served():
    """Generations of the engine on the tiny model: four prompts at once (two equal), then a second
    turn that starts with the first prompt and its answer (read from the engine's prefix store)."""
    model = tiny_moe()
    engine = TorchEngine(model, eos_token_ids=[1], pad_token_id=0, max_batch_size=8, threads=1)
    prompts = [list(range(5, 15)), list(range(5, 15)), list(range(20, 33)), list(range(40, 47))]

    async def run():
        first = await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=10, seed=i))
                                       for i, p in enumerate(prompts)])
        again = prompts[0] + first[0].token_ids + [50, 51, 52]
        second = await engine.generate(again, SamplingParams(max_tokens=6, seed=9))
        return list(zip(prompts + [again], list(first) + [second]))

    try:
        yield model, asyncio.run(run()), engine.route_shape
    finally:
        engine.close()


def test_engine_records_each_positions_experts_as_a_plain_forward_routes_them(served):
    model, calls, shape = served
    assert shape == moe.Shape(layers=2, experts=4, k=2) and shape.bytes_per_token == 4
    for prompt, gen in calls:
        ids = prompt + gen.token_ids
        assert gen.routes.dtype == np.uint8 and gen.routes.shape == (len(ids) - 1, 2, 2)  # the last never ran
        assert same_sets(gen.routes, own_routes(model, ids)[: len(ids) - 1]).all()
    assert calls[-1][1].metrics["cached_prompt_tokens"] > 0  # the second turn's kept prefix came with its experts


def test_gate_weights_are_recomputed_at_the_replayed_experts():
    """Logits (2, 1, 0, -1): the router picks experts 0 and 1; replaying 2 and 3 gives them
    softmax weights renormalised over the pair: e^0 / (e^0 + e^-1) = 0.7310586 and 0.2689414."""
    model = tiny_moe()
    gate = moe.routers(model)[0]
    moe.install(model)
    with torch.no_grad():
        gate.weight.zero_()
        gate.weight[:, 0] = torch.tensor([2.0, 1.0, 0.0, -1.0])
    x = torch.zeros((1, 64))
    x[0, 0] = 1.0
    _, scores, idx = gate(x)
    assert idx.tolist() == [[0, 1]]
    routes = torch.full((1, 1, 2, 2), -1, dtype=torch.long)
    routes[0, 0, 0] = torch.tensor([2, 3])
    load = moe.Load()
    with moe.replaying(routes, torch.ones((1, 1)), load=load, compare_B=torch.ones(1)):
        _, scores, idx = gate(x)
    assert idx.tolist() == [[2, 3]]
    assert scores[0].tolist() == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))], abs=1e-7)
    assert load.differ == {0: 1} and load.compared == {0: 1}
    with moe.replaying(routes, torch.ones((1, 1)), replay=False):
        assert gate(x)[2].tolist() == [[0, 1]]  # off: the router's own choice


def test_load_metrics_by_hand():
    """Experts of 4 picked (0,1), (0,1), (0,2): counts 3, 2, 1, 0, mean 1.5; population std
    sqrt((1.5² + 0.5² + 0.5² + 1.5²) / 4) = 1.118034, CV 0.745356; peak 3 / 1.5 = 2; expert 3 is
    below a tenth of the mean: a quarter of the experts are cold."""
    load = moe.Load()
    load.add(0, torch.tensor([[0, 1], [0, 1], [0, 2]]), 4, None, None, None)
    m = load.metrics()
    assert m["moe/l0/load_cv"] == pytest.approx(0.745356, abs=1e-6)
    assert m["moe/l0/load_peak"] == pytest.approx(2.0) and m["moe/l0/cold"] == pytest.approx(0.25)
    assert m["moe/load_cv"] == m["moe/l0/load_cv"] and "moe/route_differ" not in m


def rows_of(calls) -> list[TrainingRow]:
    rows = []
    for i, (prompt, gen) in enumerate(calls):
        n = len(prompt) + len(gen.token_ids)
        rows.append(TrainingRow(prompt + gen.token_ids, [0] * len(prompt) + [1] * len(gen.token_ids),
                                [0.0] * len(prompt) + gen.logprobs, [0.0] * len(prompt) + [1.0 - 0.5 * i] * len(
                                    gen.token_ids), [-1] * len(prompt) + gen.versions, group_id="g",
                                routes=gen.routes))
        assert len(rows[-1]) == n
    return rows


def request(replay: bool) -> RLRequest:
    return RLRequest(objective="ppo", params={"clip_low": 0.2, "clip_high": 0.2, "clip_c": None}, agg="token-mean",
                     correction="none", correction_cap=2.0, geometric_bounds=(0.999, 1.001), kl_coef=0.0,
                     topk_weight=0.0, routing_replay=replay, qdq_align=False, version=0)


def other_experts(routes: np.ndarray) -> np.ndarray:
    """Each position routed to the two experts the recorded pair left out (4 experts, top-2)."""
    out = np.empty_like(routes)
    for idx in np.ndindex(routes.shape[:2]):
        out[idx] = sorted(set(range(4)) - set(routes[idx].tolist()))
    return out


@pytest.mark.parametrize("packing", [True, False])
def test_trainer_replays_recorded_experts_at_identical_weights(served, packing):
    model, calls, _ = served
    rows = rows_of(calls)
    trainer_model = tiny_moe()
    trainer_model.rlonce_packing = packing
    # the recorded experts: the trainer computes the function the engine sampled from
    at = Trainer(trainer_model, OptimSettings(lr=0.0)).rl_step(rows, request(True))
    assert at["mismatch_kl"] < 1e-8 and at["moe/route_differ"] == pytest.approx(0.0)
    assert 0 < at["moe/load_cv"] < 2 and "moe/l1/load_peak" in at
    # other experts recorded: replay on sends every token there (a different function) ...
    moved = [dataclasses.replace(r, routes=other_experts(r.routes)) for r in rows]
    on = Trainer(tiny_moe(), OptimSettings(lr=0.0)).rl_step(moved, request(True))
    assert on["mismatch_kl"] > 1e-5 and on["moe/route_differ"] == pytest.approx(1.0)
    # ... replay off routes as the trainer's routers say, and counts every recorded token as differing
    off = Trainer(tiny_moe(), OptimSettings(lr=0.0)).rl_step(moved, request(False))
    assert off["mismatch_kl"] < 1e-8 and off["moe/route_differ"] == pytest.approx(1.0)


def test_router_freezing_keeps_router_weights_bit_identical(served):
    _, calls, _ = served
    model = tiny_moe()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Trainer(model, OptimSettings(lr=1e-2, freeze_router=True))
    for _ in range(2):
        trainer.rl_step(rows_of(calls), request(True))
    gates = {n for n, _ in model.named_parameters() if n.endswith("mlp.gate.weight")}
    assert len(gates) == 2
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (n in gates), n  # routers unchanged, everything else trained
    with pytest.raises(ValueError, match="has no routers"):
        Trainer(AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", vocab_size=VOCAB, hidden_size=32,
                                                                      intermediate_size=32, num_hidden_layers=1,
                                                                      num_attention_heads=2)),
                OptimSettings(freeze_router=True))


def test_routes_travel_from_context_to_rows_and_checkpoints(served):
    _, calls, _ = served
    prompt, gen = calls[0]
    ctx = Context([Segment(Role.PROMPT, list(prompt)),
                   Segment(Role.MODEL, gen.token_ids, gen.logprobs, gen.versions, gen.finish_reason)],
                  routes=gen.routes)
    seq = Sequence("t", "arm", [ctx], reward=1.0)
    row = sequence_to_rows(seq, 1.0)[0]
    assert np.array_equal(row.routes, gen.routes) and len(row.routes) == len(row) - 1
    back = sequence_from_dict(sequence_to_dict(seq))
    assert np.array_equal(back.contexts[0].routes, gen.routes)
    with pytest.raises(ValueError, match="routes"):
        TrainingRow(row.token_ids, row.loss_mask, row.rollout_logprobs, row.advantages, row.policy_versions,
                    routes=gen.routes.astype(np.int64))


def test_cache_of_a_sparse_model_is_reused_with_its_experts():
    """A decode step's experts equal those of a forward over the whole sequence, through transformers'
    own cache: what the engine's record rests on."""
    model = tiny_moe(1)
    moe.install(model)
    ids = list(range(3, 20))
    cache = DynamicCache()
    with torch.no_grad(), moe.recording() as rec:
        model(input_ids=torch.tensor([ids[:-1]]), use_cache=True, **{cache_keyword(model): cache})
        rec.take(1, len(ids) - 1)
        model(input_ids=torch.tensor([ids[-1:]]), use_cache=True, **{cache_keyword(model): cache})
        step = rec.take(1, 1)[0, 0]
    assert same_sets(step[None], own_routes(model, ids)[-1:]).all()


def test_mxfp4_rollout_and_aligned_training_compute_one_function():
    """The engine samples from quantize-dequantized experts; the trainer aligned to them scores the
    sampled tokens as the engine did, unaligned it does not."""
    engine = TorchEngine(tiny_moe(), eos_token_ids=[1], pad_token_id=0, threads=1, rollout_quant="mxfp4")
    prompts = [list(range(5, 15)), list(range(20, 33))]

    async def run():
        return await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=12, seed=i))
                                      for i, p in enumerate(prompts)])

    try:
        rows = rows_of(list(zip(prompts, asyncio.run(run()))))
    finally:
        engine.close()
    aligned = dataclasses.replace(request(True), qdq_align=True)
    model = tiny_moe()
    at = Trainer(model, OptimSettings(lr=0.0)).rl_step(rows, aligned)
    off = Trainer(tiny_moe(), OptimSettings(lr=0.0)).rl_step(rows, request(True))
    assert at["mismatch_kl"] < 1e-8 < 1e-6 < off["mismatch_kl"]
    assert not any(type(m).forward is not m.forward.__func__ for m in model.modules()
                   if hasattr(m, "forward") and hasattr(m.forward, "__func__"))  # aligned only during the step
    with pytest.raises(ValueError, match="dense"):
        TorchEngine(AutoModelForCausalLM.from_config(AutoConfig.for_model(
            "llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2)), eos_token_ids=[1], pad_token_id=0, rollout_quant="mxfp4")


def test_a_gateway_session_keeps_the_routing_of_every_position_through_turns_and_a_rollback(lm):
    """Two turns, then a request that rewrites the second tool result: the context's routes always
    cover its tokens but the last sampled one, and equal a plain forward's routing of them."""
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.messages import ChatRequest, Message
    from rlonce.gateway.session import GatewaySettings
    from rlonce.model.chat import get_format

    model = tiny_moe(vocab=len(lm.tokenizer))
    engine = TorchEngine(model, eos_token_ids=lm.eos_token_ids, pad_token_id=0, threads=1)
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=get_format(lm.chat_format),
                                 sampling=SamplingParams(max_tokens=8, seed=3)))
    session = gw.open("s")

    async def run():
        msgs = [Message("system", "find the key"), Message("user", "go")]
        first = await session.turn(ChatRequest(msgs))
        msgs += [Message("assistant", first.content), Message("user", "again")]
        second = await session.turn(ChatRequest(msgs))
        ctx = session.contexts[-1]
        check(ctx)
        msgs[-1] = Message("user", "something else")  # rewrites the last observation: the turn after it goes
        await session.turn(ChatRequest(msgs))
        return second

    def check(ctx):
        ids = ctx.token_ids()
        assert len(ctx.routes) == len(ids) - 1
        assert same_sets(ctx.routes, own_routes(model, ids)[:-1]).all()

    try:
        asyncio.run(run())
    finally:
        engine.close()
    check(session.contexts[-1])


def test_vllm_engine_asks_sparse_models_for_their_routes(tmp_path):
    """Which folders the vLLM engine asks for routed experts (its config names the experts), and in
    what type they are kept; the rest of that path needs a GPU."""
    from rlonce.engine.vllm_engine import sparse_route_dtype

    tiny_moe().config.save_pretrained(tmp_path / "moe")
    assert sparse_route_dtype(tmp_path / "moe") is np.uint8
    (tmp_path / "wide").mkdir()
    (tmp_path / "wide" / "config.json").write_text('{"text_config": {"n_routed_experts": 384}}')
    assert sparse_route_dtype(tmp_path / "wide") is np.uint16
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text('{"model_type": "llama"}')
    assert sparse_route_dtype(tmp_path / "dense") is None and sparse_route_dtype("org/name") is None


def test_route_differ_is_measured_at_the_rollouts_weights_only(served):
    """Two mini-batches at a large learning rate: the second runs on updated weights, where its
    routers may choose otherwise; only the first forward (the rollout's weights, where the engine's
    record is the routers' own choice) counts toward ``route_differ``, while the load counts both."""
    _, calls, _ = served
    rows = rows_of(calls)
    split = dataclasses.replace(request(False), minibatches=2, seed=1)
    trained = tiny_moe()
    m = Trainer(trained, OptimSettings(lr=0.5)).rl_step(rows, split)
    assert m["moe/route_differ"] == 0.0
    moved = sum(int((~same_sets(r.routes, own_routes(trained, r.token_ids)[: len(r.routes)])).sum()) for r in rows)
    assert moved > 0  # after the updates the routers do choose otherwise: counting that would not be 0
    model, load = tiny_moe(), moe.Load()
    moe.install(model)
    with moe.replaying(None, torch.ones((1, 3)), load=load):
        moe.routers(model)[0](torch.randn(3, 64))
    assert float(load.counts[0].sum()) == 3 * 2 and not load.compared  # k = 2 per token, nothing compared


def test_route_differ_leaves_out_rows_sampled_at_other_weights(served):
    """Rows stamped with an older version than the trainer's (async staleness) were routed by other
    weights: as for ``mismatch_kl``, their routing is not compared."""
    _, calls, _ = served
    old = [dataclasses.replace(r, routes=other_experts(r.routes),
                               policy_versions=[v + 1 if v >= 0 else v for v in r.policy_versions])
           for r in rows_of(calls)]
    m = Trainer(tiny_moe(), OptimSettings(lr=0.0)).rl_step(old, dataclasses.replace(request(True), version=1))
    assert m["moe/route_differ"] == pytest.approx(1.0)
    m = Trainer(tiny_moe(), OptimSettings(lr=0.0)).rl_step(old, dataclasses.replace(request(True), version=2))
    assert "moe/route_differ" not in m and "moe/load_cv" in m
