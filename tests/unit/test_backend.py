"""The trainer-backend contract: the RL loop trains, publishes and checkpoints through it alone,
so the local backend and the Ray cluster must offer the same members, and the local one must
do what the contract says with real weights."""

import asyncio
import copy
import dataclasses
import inspect

import pytest
import torch

from rlonce.config import load_config
from rlonce.core.records import TrainingRow
from rlonce.dist.cluster import RayCluster
from rlonce.engine.base import BackendError, SamplingParams
from rlonce.rollout.orchestrator import StepResult
from rlonce.train.backend import LocalBackend, TrainerBackend, TrainerStateError
from rlonce.train.builders import optim_settings, rl_request

MEMBERS = ["executor", "train", "publish", "pull", "close"]


def test_the_contract_names_what_the_loop_uses():
    assert {n for n in dir(TrainerBackend) if not n.startswith("_")} == set(MEMBERS)
    assert "engine" in inspect.get_annotations(TrainerBackend)


@pytest.mark.parametrize("cls", [LocalBackend, RayCluster])
def test_both_backends_keep_the_contract(cls):
    for name in MEMBERS:
        want, got = getattr(TrainerBackend, name), getattr(cls, name)
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), name
        assert list(inspect.signature(got).parameters) == list(inspect.signature(want).parameters), name


@pytest.fixture
def backend(lm, embedded_dir):
    cfg = load_config(None, ["sft.demos=0", "rl.lr=1e-3"])
    own = dataclasses.replace(lm, model=copy.deepcopy(lm.model))  # the trainer steps this one
    b = LocalBackend(cfg, own, embedded_dir, version=0, optim=optim_settings(cfg.rl))
    yield cfg, own, b
    b.close()


def _batch(lm, engine) -> StepResult:
    prompt = lm.encode("<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n")
    g = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=3)))
    n, m = len(prompt), len(g.token_ids)
    row = TrainingRow(prompt + g.token_ids, [0] * n + [1] * m, [0.0] * n + g.logprobs, [0.0] * n + [1.0] * m,
                      [-1] * n + g.versions, group_id="g0")
    return StepResult(rows=[row], ledger={}, samples=[], finished=[], metrics={})


def test_local_backend_trains_publishes_the_version_and_pulls(backend, lm):
    cfg, own, b = backend
    before = {k: v.clone() for k, v in own.model.state_dict().items()}
    batch = _batch(own, b.engine)
    metrics = asyncio.run(b.train(batch, rl_request(cfg, 1, 1, version=0)))
    assert metrics["lag_counts"] == {0: sum(batch.rows[0].loss_mask)}  # every trained token: sampled by version 0
    moved = [k for k, v in own.model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved, "the step changed no weight"
    engine_w = b.engine.model.state_dict()
    assert all(torch.equal(engine_w[k], before[k]) for k in moved)  # the engine has its own copy until publish
    from rlonce.train.checkpoint import tensor_bytes

    assert asyncio.run(b.publish(1)) == tensor_bytes(own.model.state_dict())  # publish_bytes: every tensor, once
    assert b.engine.version == 1
    engine_w = b.engine.model.state_dict()
    assert all(torch.equal(engine_w[k], v) for k, v in own.model.state_dict().items())
    other = copy.deepcopy(lm.model)
    state = b.pull(other)
    assert state["step"] == 1 and state["optimizer"]["state"]
    assert all(torch.equal(other.state_dict()[k], v) for k, v in own.model.state_dict().items())


def test_local_backend_resumes_the_optimizer_and_refuses_the_wrong_kind(backend, lm, embedded_dir):
    cfg, own, b = backend
    asyncio.run(b.train(_batch(own, b.engine), rl_request(cfg, 1, 1, version=0)))
    saved = b.pull(own.model)
    again = LocalBackend(cfg, own, embedded_dir, version=1, optim=optim_settings(cfg.rl), trainer_state=saved)
    try:
        assert again.trainer.step == 1 and again.engine.version == 1
    finally:
        again.close()
    with pytest.raises(BackendError, match='executor = "ray" and ray.trainer_workers > 1'):
        LocalBackend(cfg, own, embedded_dir, version=1, optim=optim_settings(cfg.rl),
                     trainer_state={"optimizer_full": {}, "step": 1})
    with pytest.raises(TrainerStateError, match="optimizer state"):
        LocalBackend(cfg, own, embedded_dir, version=1, optim=optim_settings(cfg.rl),
                     trainer_state={"optimizer": {"state": {}, "param_groups": []}, "step": 1})


def test_the_micro_batch_size_reaches_the_trainer(lm, embedded_dir):
    cfg = load_config(None, ["sft.demos=0", "runtime.micro_batch_tokens=64"])
    b = LocalBackend(cfg, dataclasses.replace(lm, model=copy.deepcopy(lm.model)), embedded_dir, version=0,
                     optim=optim_settings(cfg.rl))
    try:
        rows = [TrainingRow([1] * 30, [0] + [1] * 29, [0.0] * 30, [1.0] * 30, [-1] + [0] * 29, group_id=str(i))
                for i in range(5)]
        # 30-token rows in micro-batches of at most 64 padded tokens: two each, the fifth alone
        assert b.trainer._micro_batches(rows) == [[0, 1], [2, 3], [4]]
    finally:
        b.close()
