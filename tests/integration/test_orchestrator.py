"""The orchestrator: a balanced ledger under injected faults, stale drops, async collection, and
partial rollout preserving every earlier token across an engine interrupt."""

import asyncio
from dataclasses import dataclass

import pytest

from rlonce.algo.signal import SignalSettings
from rlonce.core.ledger import LedgerImbalance
from rlonce.core.records import Context, FailureCategory, Role, Segment, Sequence, Status
from rlonce.engine.base import Generation, SamplingParams
from rlonce.gateway.core import Gateway
from rlonce.gateway.session import GatewaySettings
from rlonce.model.chat import get_format
from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats
from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings

FMT = get_format("hermes")


@dataclass(frozen=True)
class T:
    task_id: str


def _seq(tid, reward, failure=None):
    ctx = Context([Segment(Role.PROMPT, [1, 2]), Segment(Role.MODEL, [3, 4], [-0.5, -0.5], [0, 0], "stop")])
    if failure:
        return Sequence(tid, "x", [ctx], Status.INFRA, failure)
    return Sequence(tid, "x", [ctx], reward=reward)


class Faults:
    """Group k of a step gets outcome plan[k]: 'ok' (contrast), 'flat' (no contrast), an infra
    category for one sequence, 'all-infra', 'raise' (the executor itself fails), or a delay."""

    def __init__(self, plan):
        self.plan = plan
        self.calls = 0

    async def run_group(self, group, n):
        kind = self.plan[self.calls % len(self.plan)]
        self.calls += 1
        await asyncio.sleep(0.01)
        tid = group.task.task_id
        if kind == "raise":
            raise RuntimeError("executor lost its worker")
        if kind == "slow":
            await asyncio.sleep(0.5)
            kind = "ok"
        if kind == "flat":
            return [_seq(tid, 0.0) for _ in range(n)]
        if kind == "all-infra":
            return [_seq(tid, None, FailureCategory.ENGINE_ERROR) for _ in range(n)]
        seqs = [_seq(tid, float(k % 2)) for k in range(n)]
        if kind != "ok":
            seqs[0] = _seq(tid, None, FailureCategory(kind))
        return seqs


def _orch(plan, *, mode="sync", staleness=1, target=2, fixed=None, acceptance=0.5, cap=None):
    """One source ``s``; with ``fixed``, a batch of that many groups a step (the job's sync step:
    exactly its target first, then refills), else the mixer's demand from ``target``."""
    mixer = SampleMixer({"s": SourceStats(target=target, acceptance=acceptance, duration=0.01, seen=1, share=1.0)},
                        MixerSettings(budget=1.0))
    return Orchestrator(Faults(plan), lambda src, i: T(f"{src}/{i}"), mixer, SignalSettings(),
                        OrchestratorSettings(mode=mode, group_size=4, staleness=staleness, batch=fixed,
                                             dispatch_cap=cap, max_sessions=64))


def test_sync_ledger_balances_under_injected_faults():
    plan = ["ok", "sandbox_timeout", "engine_error", "grader_unavailable", "flat", "all-infra", "raise", "ok"]

    async def go():
        o = _orch(plan, target=8, fixed=8, cap=1.0)  # cap 1: no refills
        res = await o.collect(1)
        await o.close()
        return res

    res = asyncio.run(go())
    e = res.ledger["s"]
    assert e.dispatched == 32 and e.carried_in == 0 and e.carried_over == 0
    # 3 single infra failures + 4 all-infra + 4 from the executor's own failure
    assert e.infra_failed == 11 and e.infra_by_category == {"sandbox_timeout": 1, "engine_error": 5,
                                                            "grader_unavailable": 1, "harness_error": 4}
    assert e.no_contrast_filtered == 4
    # contrastful groups: two clean (4 + 4) and three that lost one sequence to infra (3 + 3 + 3)
    assert e.retained == 17 and e.infra_failed + e.no_contrast_filtered + e.retained == e.dispatched
    e.check()
    assert len(res.samples) == 5 and len(res.rows) == 17  # infra sequences never reach a row
    assert e.groups_short == 3  # 5 of the 8 promised groups had contrast; the cap forbade refills


def _one_sync_step(plan, **kw):
    async def go():
        o = _orch(plan, **kw)
        res = await o.collect(1)
        await o.close()
        return res

    return asyncio.run(go())


def test_a_sync_step_buys_the_batch_it_promised():
    """Target 4 groups, half of all groups flat: the first round (4 groups) keeps 2; the refill
    sends round(2 / 0.4672) = 4 more (acceptance 0.5 → 0.6 → 0.48 → 0.584 → 0.4672 after ok,
    flat, ok, flat), which keep 2: the step trains on exactly 4 contrastful groups."""

    res = _one_sync_step(["ok", "flat"], target=4, fixed=4, cap=3.0)
    e = res.ledger["s"]
    assert (e.dispatched, e.no_contrast_filtered, e.retained, e.groups_short) == (32, 16, 16, 0)
    assert len(res.samples) == 4


def test_the_dispatch_cap_bounds_a_sync_step_and_the_shortfall_is_counted():
    """Every group flat, target 2, cap 3: 2 groups, then min(round(2 / 0.32), 6 - 2) = 4 more,
    then the cap is spent: 6 groups dispatched, none kept, 2 groups short."""

    res = _one_sync_step(["flat"], target=2, fixed=2, cap=3.0)
    e = res.ledger["s"]
    assert (e.dispatched, e.no_contrast_filtered, e.retained, e.groups_short) == (24, 24, 0, 2)
    assert res.samples == []


def test_ledger_check_refuses_an_imbalance():
    from rlonce.core.ledger import LedgerEntry

    with pytest.raises(LedgerImbalance, match="carried_in"):
        LedgerEntry(3, "s", dispatched=8, retained=4, carried_over=2).check()


def test_surplus_groups_go_stale_and_are_counted():
    """Target 1 group a step, 2 accepted: the spare waits (carried over) and is dropped as stale
    at the next step (staleness 1): nothing is lost from the ledger, nothing trained stale."""

    async def go():
        o = _orch(["ok"], target=1, acceptance=0.5)  # demand 2 → two groups dispatched
        first = await o.collect(1)
        second = await o.collect(2)
        await o.close()
        return first, second

    first, second = asyncio.run(go())
    a, b = first.ledger["s"], second.ledger["s"]
    assert (a.dispatched, a.retained, a.carried_over) == (8, 4, 4)
    assert (b.carried_in, b.stale_dropped, b.retained) == (4, 4, 4)
    assert all(s.dispatch_step == 2 for s in second.samples)


def test_async_collect_keeps_rollouts_running_and_carries_work_over():
    async def go():
        o = _orch(["ok", "flat", "slow"], mode="async", staleness=2, target=2)
        out = []
        for step in (1, 2, 3):
            out.append(await o.collect(step, max_wait=5))
            await asyncio.sleep(0.05)  # the "trainer"; the dispatcher keeps going
        await o.close()
        return out

    res = asyncio.run(go())
    for r in res:
        assert len(r.samples) == 2 and r.ledger["s"].retained == 8
    assert sum(r.ledger["s"].carried_over for r in res) > 0  # work in flight across collections
    assert res[1].ledger["s"].carried_in == res[0].ledger["s"].carried_over
    assert res[2].ledger["s"].carried_in == res[1].ledger["s"].carried_over


class Interrupting:
    """Serves a scripted turn, but the first request is cut after 3 tokens (an engine pause), as
    the torch engine does at a weight update; the continuation is sampled under version 1."""

    def __init__(self, ids):
        self.ids, self.version, self.prompts = ids, 0, []

    async def generate(self, prompt, sampling):
        self.prompts.append(list(prompt))
        if len(self.prompts) == 1:
            return Generation(self.ids[:3], [-0.1, -0.2, -0.3], [0, 0, 0], "abort")
        self.version = 1
        rest = self.ids[3:]
        return Generation(rest, [-0.9] * len(rest), [1] * len(rest), "stop")


def test_partial_rollout_keeps_every_earlier_token_log_prob_and_version(lm):
    from rlonce.model.chat import ToolCall

    ids = lm.encode(FMT.assistant_text("", [ToolCall("bash", {"command": "ls docs"})]))
    eng = Interrupting(ids)
    gw = Gateway(GatewaySettings(engine=eng, encode=lm.encode, decode=lm.decode, fmt=FMT,
                                 sampling=SamplingParams(max_tokens=64)))
    s = gw.open("p")
    r = asyncio.run(gw.call("openai-chat", {"messages": [{"role": "system", "content": "s"},
                                                          {"role": "user", "content": "u"}],
                                            "tools": [{"type": "function", "function": {"name": "bash"}}]}, "p"))
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"
    seg = [g for g in s.contexts[0].segments if g.role is Role.MODEL][0]
    assert seg.token_ids == ids  # one turn, whole
    assert seg.logprobs[:3] == [-0.1, -0.2, -0.3] and seg.logprobs[3:] == [-0.9] * (len(ids) - 3)
    assert seg.versions == [0, 0, 0] + [1] * (len(ids) - 3)  # the turn says which weights drew each token
    assert eng.prompts[1] == eng.prompts[0] + ids[:3]  # re-prefilled: context plus what was sampled
    assert s.interrupts == 1


def test_restart_replays_waiting_groups_and_reissues_prompts_without_double_counting():
    """Stop after step 2, restore a fresh orchestrator from the step's snapshot: the open work is
    carried in exactly as the ledger carried it over, waiting groups are replayed (not re-run),
    in-flight prompts are reissued, and no task is retained twice."""

    async def first():
        o = _orch(["ok", "slow", "flat"], mode="async", staleness=3, target=2)
        out = [await o.collect(s, max_wait=5) for s in (1, 2)]
        await o.close()
        return out, o.snapshot

    async def second(snapshot):
        o = _orch(["ok", "slow", "flat"], mode="async", staleness=3, target=2)
        o.load_state_dict(snapshot)
        out = [await o.collect(s, max_wait=5) for s in (3, 4)]
        await o.close()
        return out, o

    before, snap = asyncio.run(first())
    assert snap["waiting"] or snap["in_flight"]
    after, o = asyncio.run(second(snap))
    assert after[0].ledger["s"].carried_in == before[-1].ledger["s"].carried_over
    assert o.replayed == len(snap["waiting"]) and o.reissued == len(snap["in_flight"])
    trained = [x.task_id for r in before + after for x in r.samples]
    assert len(trained) == len(set(trained)) == 8  # 2 groups a step, none twice
    for r in before + after:
        r.ledger["s"].check()


class TwoArms:
    """Each group: arm ``a`` with contrast (1, 0), arm ``b`` without (0, 0)."""

    async def run_group(self, group, n):
        tid = group.task.task_id
        return [Sequence(s.task_id, arm, s.contexts, reward=r)
                for s, arm, r in ((_seq(tid, 0), "a", 1.0), (_seq(tid, 0), "a", 0.0), (_seq(tid, 0), "b", 0.0),
                                  (_seq(tid, 0), "b", 0.0))]


def test_grouped_by_arm_a_flat_arm_is_filtered_once_and_its_twin_retained():
    """``harness.group_by_arm``: the group is accepted for its arm with contrast; the flat arm's
    two sequences are counted filtered when judged, and only the two kept are booked retained
    when the step takes the group (they were booked twice and the ledger check stopped the run)."""

    async def run():
        mixer = SampleMixer({"s": SourceStats(target=1, acceptance=1.0, duration=0.01, seen=1, share=1.0)},
                            MixerSettings(budget=1.0))
        o = Orchestrator(TwoArms(), lambda src, i: T(f"{src}/{i}"), mixer, SignalSettings(),
                         OrchestratorSettings(mode="sync", group_size=4, staleness=1, batch=1, dispatch_cap=1.0,
                                              group_by_arm=True))
        try:
            return await o.collect(1)
        finally:
            await o.close()

    r = asyncio.run(run())
    e = r.ledger["s"]
    assert (e.dispatched, e.no_contrast_filtered, e.retained, e.carried_over) == (4, 2, 2, 0)
    assert [row.group_id for row in r.rows] == ["s:s/0/a@1"] * 2  # arm a's pair: rewards 1, 0 less their mean
    assert sorted(row.advantages[-1] for row in r.rows) == [-0.5, 0.5]


def test_a_reissued_task_is_still_not_reissued_twice_after_a_restart():
    """A stale task's reissue (``stale_policy = "reissue"``) that a checkpoint caught waiting keeps
    its mark: going stale again after the restart drops it, as the uninterrupted run does."""
    from rlonce.rollout.groups import FINISHED, Group
    from rlonce.rollout.orchestrator import SourceRules

    def orch():
        mixer = SampleMixer({"s": SourceStats(target=1, acceptance=1.0, duration=0.01, seen=1, share=1.0)},
                            MixerSettings(budget=1.0))
        return Orchestrator(None, lambda src, i: T(f"{src}/{i}"), mixer, SignalSettings(),
                            OrchestratorSettings(mode="sync", group_size=4, staleness=1,
                                                 rules={"s": SourceRules(1, "reissue")}))

    seqs = [_seq("s/5", float(k % 2)) for k in range(4)]
    runs = []
    for resumed in (False, True):
        o = orch()
        g = Group("s:5@2", T("s/5"), "s", 2, 0, index=5, again=True, state=FINISHED, accepted=True, retained=4,
                  sequences=seqs)
        o.groups[g.gid] = g
        if resumed:
            snap, o = o.state_dict(), orch()
            o.load_state_dict(snap)
            o.step = 3
            o._restore_open_work()
        o.step = 3
        o._evict_stale()
        runs.append((o.requeue["s"], o.window["s"].stale_reissued, o.window["s"].stale_dropped))
    assert runs[0] == runs[1] == ([], 0, 4)


class Peak:
    """Contrastful groups of 512 context tokens per sequence; records the most groups running at once."""

    def __init__(self):
        self.running = self.peak = 0

    async def run_group(self, group, n):
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0.05)
        self.running -= 1
        seqs = [_seq(group.task.task_id, float(k % 2)) for k in range(n)]
        for s in seqs:
            s.metrics["context_tokens"] = 512.0
        return seqs


@pytest.mark.parametrize("budget, peak", [(None, 16), (4096, 2)])
def test_rollout_kv_budget_reaches_the_async_dispatcher(budget, peak):
    from types import SimpleNamespace

    from rlonce.config import load_config
    from rlonce.rollout.builders import build_orchestrator
    from rlonce.rollout.sources import plan_sources

    keys = ["rollout.mode=async", "rl.group_size=4", "rollout.target_groups=6", "rollout.max_sessions=64"]
    cfg = load_config(None, keys + ([f"rollout.kv_budget={budget}"] if budget else []))
    plan = plan_sources(cfg)[0]
    domain = SimpleNamespace(task=lambda split, i: T(f"{plan.label}/{i}"))
    executor = Peak()
    o = build_orchestrator(cfg, {plan.label: SimpleNamespace(plan=plan, domain=domain)}, executor, SignalSettings(),
                           None)
    assert o.s.kv_budget == (float("inf") if budget is None else 4096.0)

    async def go():
        r = await o.collect(1, max_wait=5)
        await o.close()
        return r

    assert len(asyncio.run(go()).samples) == 6
    # each group is predicted to hold 512 tokens × 4 sequences = 2048: a budget of 4096 admits two
    # at once; without one, the session cap alone admits 64 / 4 = 16
    assert executor.peak == peak


class Sizes:
    """Contrastful groups of whatever size the orchestrator asks; records the most sequences running at once."""

    def __init__(self):
        self.running = self.peak = 0
        self.asked: dict[str, set] = {}

    async def run_group(self, group, n):
        self.asked.setdefault(group.source, set()).add(n)
        self.running += n
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0.02)
        self.running -= n
        return [_seq(group.task.task_id, float(k % 2)) for k in range(n)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_source_with_its_own_group_size_gets_groups_of_that_size(tmp_path, mode):
    from types import SimpleNamespace

    from rlonce.config import load_config
    from rlonce.rollout.builders import build_orchestrator
    from rlonce.rollout.sources import plan_sources

    (tmp_path / "c.toml").write_text(
        f'[rl]\ngroup_size = 2\ntasks_per_step = 4\nconcurrency = 10\n[rollout]\nmode = "{mode}"\n'
        'target_groups = 4\nmax_sessions = 10\n'
        '[[sources]]\nname = "toolfind"\nlabel = "easy"\n'
        '[[sources]]\nname = "toolfind"\nlabel = "hard"\ngroup_size = 8\n')
    cfg = load_config(str(tmp_path / "c.toml"), [])
    plans = {p.label: p for p in plan_sources(cfg)}
    assert (plans["easy"].group_size, plans["hard"].group_size) == (2, 8)
    sources = {k: SimpleNamespace(plan=p, domain=SimpleNamespace(task=lambda split, i, k=k: T(f"{k}/{i}")))
               for k, p in plans.items()}
    executor = Sizes()
    o = build_orchestrator(cfg, sources, executor, SignalSettings(), None)

    async def go():
        r = await o.collect(1, max_wait=5)
        await o.close()
        return r

    res = asyncio.run(go())
    assert executor.asked == {"easy": {2}, "hard": {8}}
    assert sorted(len(s.sequences) for s in res.samples) == [2, 2, 8, 8]
    for label, size in (("easy", 2), ("hard", 8)):
        e = res.ledger[label]
        assert e.dispatched % size == 0 and e.dispatched >= 2 * size
        e.check()
    # the session cap counts sequences: a group of 8 and one of 2 fit in 10, never more
    assert executor.peak <= 10
