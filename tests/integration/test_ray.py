"""The Ray executor on a local Ray instance: real actors, real sandboxes, the embedded model.

- weights published by the trainer actor reach every engine actor by version, and the engine
  then samples exactly what an in-process engine with the same weights samples;
- killing a harness-pool actor mid-step: its in-flight sequences are infra (worker_lost), the
  ledger balances, Ray restarts the actor and the next step runs on it;
- a group that outlives its timeout is infra (call_timeout) and the step does not wait for it;
- a short async run of the whole job under ``executor = "ray"`` with two data-parallel trainer
  ranks balances and chains its ledger, keeps the staleness bound and trains.
"""

import asyncio
import copy
from pathlib import Path

import pytest
import torch
from conftest import slack

ray = pytest.importorskip("ray")

from rlonce.config import load_config  # noqa: E402
from rlonce.core.records import FailureCategory  # noqa: E402
from rlonce.dist.cluster import RAY_SYSTEM_CONFIG, ray_temp_dir  # noqa: E402
from rlonce.engine.base import EngineError, SamplingParams  # noqa: E402
from rlonce.engine.torch_engine import TorchEngine  # noqa: E402
from rlonce.recipes.grpo import Job, run  # noqa: E402
from rlonce.telemetry.metrics import read_jsonl  # noqa: E402

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory):
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _system_config=RAY_SYSTEM_CONFIG,
             _temp_dir=str(ray_temp_dir(tmp_path_factory.mktemp("ray") / "ray")))
    yield
    ray.shutdown()


def test_actors_run_at_the_drivers_priority(ray_instance):
    """Ray's default worker niceness (15) starved actors beside ordinary CPU work: not ours."""
    import os

    @ray.remote
    class Probe:
        def nice(self) -> int:
            return os.nice(0)

    assert ray.get(Probe.remote().nice.remote(), timeout=300) == os.nice(0)


def _cfg(out: Path, *extra: str):
    return load_config(REPO / "configs" / "tiny.toml", [
        f"out={out}", "executor=ray", "sft.demos=0", "rl.tasks_per_step=4", "rl.group_size=4",
        "ray.harness_pools=2", f"ray.call_timeout_s={slack(60):.0f}", "ray.group_timeout_s=120", "eval.heldout_tasks=4",
        *extra])


@pytest.fixture
def job(ray_instance, tmp_path):
    made = []

    def make(*extra: str) -> Job:
        j = Job(_cfg(tmp_path / f"run{len(made)}", *extra), progress=False)
        j.start(False)
        j.ensure_engine()
        made.append(j)
        return j

    yield make
    for j in made:
        j.close()


def test_published_weights_reach_every_engine_by_version(job):
    j = job("ray.engines=2")
    trained = copy.deepcopy(j.ctx.lm.model)
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(1.05)
    # the trainer actor holds the weights; put perturbed ones there and publish them as version 7
    ray.get(j.backend.trainer.__ray_call__.remote(lambda self: self.model.load_state_dict(trained.state_dict())))
    from rlonce.train.checkpoint import tensor_bytes

    assert asyncio.run(j.backend.publish(7)) == tensor_bytes(trained.state_dict())  # publish_bytes: the whole model
    assert j.engine.version == 7
    prompt = j.ctx.lm.encode("<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n")
    sp = SamplingParams(max_tokens=24, temperature=1.0, seed=123)

    async def both():
        return await asyncio.gather(*(j.engine.generate(prompt, sp) for _ in range(4)))

    remote = asyncio.run(both())
    pad = j.ctx.lm.tokenizer.pad_token_id
    local = TorchEngine(trained, eos_token_ids=j.ctx.lm.eos_token_ids, pad_token_id=pad if pad is not None else 0,
                        version=7)
    try:
        ref = asyncio.run(local.generate(prompt, sp))
    finally:
        local.close()
    for g in remote:  # requests were spread over both engine actors; each carries version 7's weights
        assert g.versions == [7] * len(g.token_ids)
        assert g.token_ids == ref.token_ids
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_restarted_engine_serves_the_latest_published_version(job):
    j = job("ray.max_restarts=2")
    asyncio.run(j.backend.publish(3))
    victim = j.backend.engine_actors[0]
    pid_before = ray.get(victim.ready.remote())["pid"]
    ray.kill(victim, no_restart=False)
    prompt = j.ctx.lm.encode("hello")
    sp = SamplingParams(max_tokens=4, seed=1)
    with pytest.raises(EngineError):  # a request to the dead or restarting actor is an engine error
        asyncio.run(j.engine.generate(prompt, sp))
    for _ in range(600):
        try:
            info = ray.get(victim.ready.remote(), timeout=5)
            break
        except (ray.exceptions.RayError, TimeoutError):
            __import__("time").sleep(0.1)
    assert info["pid"] != pid_before and info["version"] == 3  # fetched from the trainer when it restarted
    assert set(asyncio.run(j.engine.generate(prompt, sp)).versions) == {3}


def test_killed_harness_pool_is_infra_restarted_and_the_run_goes_on(job):
    j = job("ray.max_restarts=2", "rollout.sync_dispatch_cap=1")  # one round per step: the lost groups are not refilled
    orch = j.orchestrator()
    executor = orch.executor
    victim = j.backend.pools[0]
    pid_before = ray.get(victim.ready.remote())["pid"]

    async def step_with_kill():
        collecting = asyncio.create_task(orch.collect(1))
        while executor.load[0] == 0:  # a group is in flight on pool 0
            await asyncio.sleep(0.001)
        ray.kill(victim, no_restart=False)
        res = await asyncio.wait_for(collecting, 300)
        for _ in range(1200):  # the executor probes the pool until Ray has restarted it
            if executor.healthy[0]:
                break
            await asyncio.sleep(0.1)
        res2 = await asyncio.wait_for(orch.collect(2), 300)
        await orch.close()
        return res, res2

    res, res2 = asyncio.run(step_with_kill())
    e = res.ledger["toolfind"]
    assert e.dispatched == 16
    assert e.infra_by_category.get(FailureCategory.WORKER_LOST.value, 0) >= 4  # at least the group it held
    assert e.infra_failed == sum(e.infra_by_category.values())
    assert e.dispatched == e.finished + e.infra_failed
    e.check()
    assert executor.lost[0] >= 1
    lost = [s for s in res.finished if s.failure is FailureCategory.WORKER_LOST]
    assert lost and all(s.reward is None for s in lost)  # never graded, never a reward
    # step 2 ran with the restarted actor back in rotation: nothing lost, every sequence graded
    e2 = res2.ledger["toolfind"]
    e2.check()
    assert e2.infra_failed == 0 and e2.finished == 16
    info = ray.get(victim.ready.remote())
    assert info["pid"] != pid_before and info["groups"] >= 1


def test_group_past_its_timeout_is_infra_and_the_step_ends(job):
    j = job("ray.group_timeout_s=0.05", "rollout.sync_dispatch_cap=1")
    orch = j.orchestrator()

    async def go():
        res = await asyncio.wait_for(orch.collect(1), 120)
        await orch.close()
        return res

    e = asyncio.run(go()).ledger["toolfind"]
    assert e.infra_by_category == {FailureCategory.CALL_TIMEOUT.value: 16}
    e.check()


@pytest.mark.slow  # a whole job (90 s on 2 cores); the default suite keeps one whole-job smoke run (tests/e2e)
def test_whole_mixed_async_job_on_ray_with_two_data_parallel_trainers(ray_instance, tmp_path):
    """A mixed run (toolfind and arithmetic) with async rollout (partial rollout across weight
    updates) and two FSDP2 trainer ranks: each harness pool runs both sources."""
    out = tmp_path / "ray-run"
    cfg = load_config(REPO / "configs" / "tiny_mixed.toml", [f"out={out}", "executor=ray", "rollout.mode=async",
                                                       "rl.steps=3", "eval.heldout_tasks=8", "checkpoint.every=2",
                                                       "ray.trainer_workers=2"])
    summary = run(cfg, progress=False)
    assert summary["executor"] == "ray" and summary["rl_steps"] == 3
    ledger = read_jsonl(out / "ledger.jsonl")
    assert [(e["step"], e["source"]) for e in ledger] == [(s, n) for s in (1, 2, 3) for n in ("toolfind", "arith")]
    carried = {"toolfind": 0, "arith": 0}
    for e in ledger:
        assert e["carried_in"] == carried[e["source"]] and e["infra_failed"] == 0
        assert e["carried_in"] + e["dispatched"] == (e["no_contrast_filtered"] + e["penalty_rejected"]
                                                     + e["stale_dropped"] + e["retained"] + e["carried_over"])
        carried[e["source"]] = e["carried_over"]
    assert sum(e["dispatched"] for e in ledger if e["source"] == "arith") > 0
    assert set(summary["sources"]) == {"toolfind", "arith"}
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    trained = [r for r in steps if r["retained_rows"]]
    assert trained, "no step had a contrastful group to train on"
    assert summary["policy_version"] == len(trained)
    for r in trained:
        assert r["version_lag_max"] <= 1 and r["staleness_violations"] == 0  # async staleness 2
        # the engine actor got the weights the two FSDP ranks trained, gathered: their log-probs agree
        if r["mismatch_tokens"]:
            assert r["mismatch_kl"] < 1e-6
    assert any(r["mismatch_tokens"] for r in trained)
    traj = read_jsonl(sorted((out / "trajectories").glob("step-*.jsonl"))[-1])
    assert traj and all(t["text"] for t in traj if t["turns"])  # tokens fetched from the object store
    from rlonce.recipes.audit import audit
    from rlonce.telemetry.rollouts import read_step

    for r in steps:  # every trained row fetched from the object store and stored, as on the local executor
        meta, cols = read_step(out, r["step"])
        assert meta["rows_remote"] == 0 and len(meta["rows"]) == len(cols["row_offsets"]) - 1 == r["retained_rows"]
    verdicts = audit(out)
    assert all(v.ok for v in verdicts), [v.line() for v in verdicts if not v.ok]
    saved = torch.load(sorted((out / "checkpoints").glob("step-*"))[-1] / "trainer_state.pt", weights_only=False)
    assert set(saved["rl_trainer"]) == {"optimizer_full", "step"}  # unsharded, loadable by any number of ranks
    assert saved["rl_trainer"]["step"] == len(trained)


def test_ray_temp_dir_fits_unix_socket_paths(tmp_path):
    short = tmp_path.parent / "r"
    assert ray_temp_dir(short) == short.absolute() and short.is_dir()
    deep = tmp_path / ("a-long-run-directory-name" * 3) / "ray"
    got = ray_temp_dir(deep)
    assert len(str(got)) < 45 and deep.is_symlink() and deep.resolve() == got.resolve()
    assert ray_temp_dir(deep) == got  # the same folder again, the link kept


@pytest.mark.slow
def test_job_on_a_ray_start_head_cluster(tmp_path):
    """`ray start --head`, then a run joins it with ray.address=auto (stops every Ray process on
    the machine afterwards: slow suite only)."""
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    temp = ray_temp_dir(tmp_path / "head")
    subprocess.run([bin_dir / "ray", "start", "--head", "--num-cpus", "4", "--include-dashboard=false",
                    f"--temp-dir={temp}", "--disable-usage-stats"], check=True, capture_output=True)
    try:
        out = tmp_path / "run"
        r = subprocess.run([bin_dir / "rlonce", "train", str(REPO / "configs" / "tiny.toml"), "--executor", "ray",
                            "--out", str(out), "ray.address=auto", "rl.steps=2", "sft.demos=64",
                            "eval.heldout_tasks=4", "--quiet"], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        for e in read_jsonl(out / "ledger.jsonl"):
            assert e["dispatched"] == e["finished"] + e["infra_failed"]
        assert not (out / "ray").exists()  # the cluster's own temp dir was used
    finally:
        subprocess.run([bin_dir / "ray", "stop", "--force"], capture_output=True)


def test_split_payloads_gives_each_group_to_one_rank_balanced_by_rows():
    from rlonce.dist.cluster import split_payloads
    from rlonce.dist.pools import RemotePayload

    payloads = [RemotePayload(f"ref{i}", rows, 1.0) for i, rows in enumerate([8, 3, 8, 5, 1, 7])]
    shares = split_payloads(payloads, 2)
    assert sorted(p.ref for s in shares for p in s) == sorted(p.ref for p in payloads)  # each exactly once
    assert [sum(p.rows for p in s) for s in shares] == [16, 16]  # 8+7+1 | 8+5+3
    assert split_payloads(payloads[:1], 3)[1:] == [[], []]  # a rank may get nothing (it still steps)
