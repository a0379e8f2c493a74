"""Task sources: the config, whole-group targets by share, a mixed batch with a ledger per source,
per-source staleness and stale policy, the online difficulty filter, and the per-source metrics."""

import asyncio
from collections import Counter
from dataclasses import dataclass

import pytest

from rlonce.algo.signal import SignalSettings
from rlonce.config import ConfigError, load_config
from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import Context, Grade, Role, Segment, Sequence
from rlonce.rollout.difficulty import DifficultyFilter
from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats
from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings, SourceRules
from rlonce.rollout.sources import plan_sources
from rlonce.telemetry.step import StepInputs, source_metrics

MIXED = """
out = "runs/x"
[rl]
tasks_per_step = 8
[sft]
demos = 300
[[sources]]
name = "toolfind"
share = 2
[[sources]]
name = "reasoning"
label = "arith"
arms = ["single-turn"]
share = 1
staleness = 3
stale_policy = "reissue"
heldout_tasks = 100
[[sources]]
name = "reasoning"
label = "arith-fixed"
arms = ["single-turn"]
share = 1
sft_demos = 7
sft_epochs = 40
sft_detour_p = 0
difficulty_window = 2
"""


def test_sources_resolve_with_every_default_from_the_run(tmp_path):
    f = tmp_path / "mixed.toml"
    f.write_text(MIXED)
    cfg = load_config(f, ["rollout.mode=async"])
    plans = {p.label: p for p in plan_sources(cfg)}
    assert list(plans) == ["toolfind", "arith", "arith-fixed"]
    assert [p.share for p in plans.values()] == [0.5, 0.25, 0.25]
    tf, ar, fx = plans.values()
    assert (tf.arms, tf.staleness, tf.stale_policy, tf.heldout_tasks) == (("mini-bash",), 2, "drop", 200)
    assert (ar.arms, ar.staleness, ar.stale_policy, ar.heldout_tasks, ar.during_tasks) == (
        ("single-turn",), 3, "reissue", 100, 64)
    # 300 demos split by share (2 : 1) over the sources that set none of their own
    assert (tf.sft_demos, ar.sft_demos, fx.sft_demos, fx.difficulty_window) == (200, 100, 7, 2)
    assert (tf.sft_epochs, ar.sft_epochs, fx.sft_epochs) == (5, 5, 40)  # sft.epochs unless a source sets its own
    assert (tf.sft_detour_p, fx.sft_detour_p) == (0.5, 0.0)
    assert ar.options.name == "reasoning" and not hasattr(ar.options, "share")
    assert (tf.dispatch_cap, tf.max_turns, ar.max_context) == (3.0, 3, 1024)
    one = plan_sources(load_config(None, []))
    assert [(p.label, p.share, p.sft_demos, p.staleness) for p in one] == [("toolfind", 1.0, 1000, 1)]


def test_sources_config_refuses_ambiguity_with_one_line_fixes(tmp_path):
    f = tmp_path / "both.toml"
    f.write_text('[task]\nname = "reasoning"\n[[sources]]\nname = "toolfind"\n')
    with pytest.raises(ConfigError, match="either \\[task\\] .* or \\[\\[sources\\]\\]"):
        load_config(f, [])
    f.write_text('[[sources]]\nname = "toolfind"\n[[sources]]\nname = "toolfind"\n')
    with pytest.raises(ConfigError, match="two sources are labelled 'toolfind'"):
        load_config(f, [])
    for bad in ("share = 0", "staleness = 0", 'label = "a b"', 'stale_policy = "keep"', "share = nan"):
        f.write_text(f'[[sources]]\nname = "toolfind"\n{bad}\n')
        with pytest.raises(ConfigError, match="sources"):
            load_config(f, [])


def test_whole_group_targets_follow_the_shares_exactly_over_steps():
    """Shares 0.4 / 0.3 / 0.3 of 8 groups: wants 3.2 / 2.4 / 2.4; floors 3 / 2 / 2, the eighth to
    the largest remainder (b, by name on a tie) → 3 / 3 / 2, carry 0.2 / -0.6 / 0.4; then
    3.4 / 1.8 / 2.8 → 3 / 2 / 3. Over 10 steps exactly 32 / 24 / 24."""
    m = SampleMixer({n: SourceStats(0, share=s) for n, s in (("a", 0.4), ("b", 0.3), ("c", 0.3))})
    steps = [m.plan_step(8) for _ in range(10)]
    assert steps[0] == {"a": 3, "b": 3, "c": 2} and steps[1] == {"a": 3, "b": 2, "c": 3}
    assert all(sum(t.values()) == 8 for t in steps)
    assert sum((Counter(t) for t in steps), Counter()) == Counter({"a": 32, "b": 24, "c": 24})
    assert [m.sources[n].target for n in "abc"] == list(steps[-1].values())
    restored = SampleMixer({n: SourceStats(0, share=s) for n, s in (("a", 0.4), ("b", 0.3), ("c", 0.3))})
    restored.load_state_dict(m.state_dict())
    assert restored.plan_step(8) == m.plan_step(8)  # the carry is checkpointed


@dataclass(frozen=True)
class T:
    task_id: str


def _seq(tid, reward):
    ctx = Context([Segment(Role.PROMPT, [1, 2]), Segment(Role.MODEL, [3, 4], [-0.5, -0.5], [0, 0], "stop")])
    seq = Sequence(tid, "x", [ctx])
    seq.set_grade(Grade(reward, passed=reward >= 1))
    return seq


class BySource:
    """Per source: 'ok' (contrast), 'fail' (all 0) or 'pass' (all 1); 'slow' sources sleep."""

    def __init__(self, kinds, slow=()):
        self.kinds, self.slow = kinds, set(slow)

    async def run_group(self, group, n):
        await asyncio.sleep(0.3 if group.source in self.slow else 0.005)
        kind, tid = self.kinds[group.source], group.task.task_id
        if callable(kind):
            kind = kind(tid)
        return [_seq(tid, float(k % 2) if kind == "ok" else float(kind == "pass")) for k in range(n)]


def _orch(kinds, shares, *, batch, mode="sync", rules=None, tasks=None, slow=()):
    mixer = SampleMixer({n: SourceStats(0, share=s, duration=0.01, seen=1) for n, s in shares.items()},
                        MixerSettings(budget=1.0))
    return Orchestrator(BySource(kinds, slow), tasks or (lambda src, i: T(f"{src}/{i}")), mixer, SignalSettings(),
                        OrchestratorSettings(mode=mode, group_size=4, staleness=1, batch=batch, dispatch_cap=3.0,
                                             max_sessions=64, rules=rules or {}))


def test_a_sync_step_mixes_sources_by_share_and_keeps_a_ledger_for_each():
    """Batch 5, shares 0.6 / 0.2 / 0.2: every step trains 3 groups of a and 1 of b. Source c
    (0.2 × 5 = 1 group a step) always fails: dynamic filtering drops its groups, the step refills it up
    to 3× its target, and its shortfall is counted for c alone."""

    async def go():
        o = _orch({"a": "ok", "b": "ok", "c": "fail"}, {"a": 0.6, "b": 0.2, "c": 0.2}, batch=5)
        out = [await o.collect(s) for s in (1, 2, 3, 4, 5)]
        await o.close()
        return out

    steps = asyncio.run(go())
    taken = [Counter(x.source for x in r.samples) for r in steps]
    assert taken == [Counter({"a": 3, "b": 1})] * 5
    for r in steps:
        for e in r.ledger.values():
            e.check()
    c = [r.ledger["c"] for r in steps]
    # targets of c by step: 1, 1, 1, 1, 1 (0.2 × 5); each step dispatches 1, then refills up to 3
    assert [(e.dispatched, e.no_contrast_filtered, e.groups_short) for e in c] == [(12, 12, 1)] * 5
    assert all(r.ledger["a"].groups_short == 0 and r.ledger["a"].retained == 12 for r in steps)
    assert sorted(steps[0].finished_sources) == sorted(["a"] * 12 + ["b"] * 4 + ["c"] * 12)

    async def capped():  # c's own dispatch cap of 1: no refills for c, the others as before
        o = _orch({"a": "ok", "b": "ok", "c": "fail"}, {"a": 0.6, "b": 0.2, "c": 0.2}, batch=5,
                  rules={"c": SourceRules(1, dispatch_cap=1.0)})
        res = await o.collect(1)
        await o.close()
        return res

    res = asyncio.run(capped())
    assert (res.ledger["c"].dispatched, res.ledger["c"].groups_short, res.ledger["a"].retained) == (4, 1, 12)


def test_each_source_keeps_its_own_staleness_and_stale_policy():
    """Async, batch 2 split 1 : 1, group s slow. Source 'drop' (staleness 1) loses its spare
    groups for good; source 'again' (staleness 1, reissue) gets its stale tasks dispatched again."""

    async def go():
        rules = {"drop": SourceRules(1, "drop"), "again": SourceRules(1, "reissue")}
        o = _orch({"drop": "ok", "again": "ok"}, {"drop": 0.5, "again": 0.5}, batch=2, mode="async", rules=rules)
        res = [await o.collect(s) for s in (1, 2, 3)]
        await o.close()
        return o, res

    o, res = asyncio.run(go())
    for r in res:
        for e in r.ledger.values():
            e.check()
    stale = {n: sum(r.ledger[n].stale_dropped for r in res) for n in ("drop", "again")}
    reissued = sum(r.ledger["again"].stale_reissued for r in res)
    assert stale["drop"] > 0 and stale["again"] > 0
    assert reissued * 4 == stale["again"] and sum(r.ledger["drop"].stale_reissued for r in res) == 0
    ran = [x.task_id for r in res for x in r.samples if x.source == "again"]
    dropped_ids = {f"again/{i}" for i in range(o.next_index["again"])} - set(ran)
    # every stale task of 'again' is queued or ran again: none is lost
    assert dropped_ids <= {f"again/{i}" for i in o.requeue["again"]} | {g.task.task_id for g in o.groups.values()}


def test_the_difficulty_filter_skips_saturated_tasks_and_retests_them():
    f = DifficultyFilter(2)
    f.observe("t", 0.0)
    assert not f.skip("t")  # one group is not a history
    f.observe("t", 0.0)
    assert [f.skip("t") for _ in range(3)] == [True, True, False]  # skipped twice, then retested
    f.observe("t", 0.5)
    assert not f.skip("t")
    f.observe("u", 1.0)
    f.observe("u", 1.0)
    assert f.skip("u")
    g = DifficultyFilter(2)
    g.load_state_dict(f.state_dict())
    assert g.history == f.history and g.skips == f.skips
    assert not DifficultyFilter(0).skip("u")


def test_a_source_with_a_difficulty_window_pays_less_for_a_task_it_always_fails():
    """A pack of two tasks cycled: 'hard' always fails, 'mid' has contrast. With a window of 2,
    after 'hard' failed twice the stream skips it (counted) and dispatches 'mid' instead."""

    def tasks(src, i):
        return T(("mid", "hard")[i % 2])

    async def go(window):
        rules = {"p": SourceRules(1, "drop", window)}
        o = _orch({"p": lambda tid: "ok" if tid == "mid" else "fail"}, {"p": 1.0}, batch=1, rules=rules, tasks=tasks)
        res = [await o.collect(s) for s in range(1, 7)]
        await o.close()
        return res

    on, off = asyncio.run(go(2)), asyncio.run(go(0))
    skipped = sum(r.ledger["p"].difficulty_skipped for r in on)
    filtered = [sum(r.ledger["p"].no_contrast_filtered for r in res) for res in (on, off)]
    assert skipped >= 2 and sum(r.ledger["p"].difficulty_skipped for r in off) == 0
    assert filtered[0] < filtered[1]  # fewer rollouts paid for on a task that teaches nothing
    assert all(len(r.samples) == 1 for r in on)


def test_per_source_metrics_are_hand_countable():
    a = LedgerEntry(1, "a", dispatched=12, retained=8, no_contrast_filtered=4, finished=12)
    b = LedgerEntry(1, "b", dispatched=8, retained=3, infra_failed=1, finished=7, hack_zeroed=1,
                    infra_by_category={"sandbox_timeout": 1})
    seqs = [_seq("x", 1.0), _seq("x", 0.0), _seq("y", 1.0)]
    seqs[2].metrics = {"intercepted_git_history": 2.0, "intercepted_fetch_upstream": 1.0, "seconds": 3.0}
    x = StepInputs(step=1, finished=seqs, trained=[], ledger={"a": a, "b": b}, rollout_seconds=1.0, train_seconds=1.0,
                   retained_rows=0, version=1, violations=1, finished_sources=["a", "a", "b"],
                   shares={"a": 0.75, "b": 0.25}, taken_groups={"a": 2, "b": 1})
    m = source_metrics(x)
    assert (m["src/a/target_share"], m["src/a/retained_share"], m["src/b/retained_share"]) == (0.75, 2 / 3, 1 / 3)
    assert (m["src/a/reward_mean"], m["src/a/success_rate"], m["src/b/success_rate"]) == (0.5, 0.5, 1.0)
    assert (m["src/b/intercepted"], m["src/b/hack_zeroed"], m["src/b/infra/sandbox_timeout"]) == (3.0, 1.0, 1.0)
    assert (m["src/a/filtered"], m["src/b/seconds_mean"], m["src/a/retained_groups"]) == (4.0, 3.0, 2.0)
    assert source_metrics(StepInputs(step=1, finished=seqs, trained=[], ledger={"a": a}, rollout_seconds=1.0,
                                     train_seconds=1.0, retained_rows=0, version=1, violations=1)) == {}


def test_a_restart_replays_every_sources_open_work_within_its_own_staleness():
    """A mixed async run stopped after step 3 and restored from the step's snapshot: each source's
    carried-over work is carried in, its waiting groups replayed, its prompts in flight reissued,
    the targets' carry and the difficulty history restored; no task is trained twice."""
    shares = {"fast": 0.5, "slow": 0.5}
    rules = {"fast": SourceRules(3, "drop", 2), "slow": SourceRules(3)}

    def make():
        return _orch({"fast": "ok", "slow": "ok"}, shares, batch=3, mode="async", rules=rules, slow=("slow",))

    async def first():
        o = make()
        out = [await o.collect(s, max_wait=5) for s in (1, 2, 3)]
        await o.close()
        return out, o.snapshot

    async def second(snapshot):
        o = make()
        o.load_state_dict(snapshot)
        restored = o.difficulty["fast"].state_dict()
        out = [await o.collect(s, max_wait=5) for s in (4, 5)]
        await o.close()
        return out, o, restored

    before, snap = asyncio.run(first())
    assert snap["waiting"] or snap["in_flight"]
    # targets of 3 split 1 : 1: 2 / 1 (the tie to 'fast' by name), 1 / 2, 2 / 1 → carry -0.5 / 0.5
    assert {n: v["carry"] for n, v in snap["mixer"].items()} == {"fast": -0.5, "slow": 0.5}
    after, o, restored = asyncio.run(second(snap))
    for n in shares:
        assert after[0].ledger[n].carried_in == before[-1].ledger[n].carried_over
    assert o.replayed == len(snap["waiting"]) and o.reissued == len(snap["in_flight"])
    assert restored == snap["difficulty"]["fast"] and restored["history"]
    trained = [x.task_id for r in before + after for x in r.samples]
    assert len(trained) == len(set(trained)) == 15  # 3 groups a step, none twice
    assert Counter(t.split("/")[0] for t in trained) == Counter({"fast": 8, "slow": 7})  # step 4: 1 / 2, 5: 2 / 1
    for r in before + after:
        for e in r.ledger.values():
            e.check()


def test_an_async_step_does_not_wait_forever_for_a_source_that_accepts_nothing():
    """Async, batch 4 split 1 : 1, source 'never' always fails: a step stops waiting for it once
    it has finished its cap's worth of groups (3 × its target of 2) and counts the 2 missing
    groups; 'ok' trains its 2."""

    async def go():
        o = _orch({"ok": "ok", "never": "fail"}, {"ok": 0.5, "never": 0.5}, batch=4, mode="async")
        res = [await asyncio.wait_for(o.collect(s), 30) for s in (1, 2)]
        await o.close()
        return res

    for r in asyncio.run(go()):
        assert Counter(x.source for x in r.samples) == Counter({"ok": 2})
        assert (r.ledger["never"].groups_short, r.ledger["ok"].groups_short) == (2, 0)
        assert r.ledger["never"].no_contrast_filtered >= 6 * 4
        for e in r.ledger.values():
            e.check()


def test_a_bug_in_judging_is_an_internal_error_of_the_group_never_a_group_left_running():
    from rlonce.core.records import FailureCategory
    from rlonce.errors import INTERNAL_ERRORS

    async def go():
        o = _orch({"s": "ok"}, {"s": 1.0}, batch=2)

        class Flaky:  # the real Judge, except that judging the first group raises
            def __init__(self, judge):
                self.judge, self.calls = judge, 0

            def __call__(self, *a):
                self.calls += 1
                if self.calls == 1:
                    raise KeyError("a bug of ours")
                return self.judge(*a)

            def __getattr__(self, name):
                return getattr(self.judge, name)

        o.judge = Flaky(o.judge)
        res = await asyncio.wait_for(o.collect(1), 30)
        await o.close()
        return res

    res = asyncio.run(go())
    e = res.ledger["s"]
    e.check()
    assert e.infra_by_category == {FailureCategory.INTERNAL_ERROR.value: 4} and len(res.samples) == 2
    assert len(INTERNAL_ERRORS) == 1 and "KeyError" in INTERNAL_ERRORS[0]
    INTERNAL_ERRORS.clear()  # provoked on purpose


def test_a_task_stream_that_raises_in_async_mode_fails_the_step_instead_of_hanging_it():
    def tasks(src, i):
        raise RuntimeError("the pack holds no train task")

    async def go():
        o = _orch({"s": "ok"}, {"s": 1.0}, batch=1, mode="async", tasks=tasks)
        try:
            await asyncio.wait_for(o.collect(1), 10)
        finally:
            await o.close()

    with pytest.raises(RuntimeError, match="no train task"):
        asyncio.run(go())


def test_the_difficulty_filter_counts_exactly_the_tasks_it_skipped_even_at_its_limit():
    """Every task saturated and a window far above ``MAX_SKIPS``: a dispatch passes over 64
    tasks (counted) and runs the 65th, which is not counted as skipped."""
    from rlonce.rollout.orchestrator import MAX_SKIPS

    o = _orch({"p": "fail"}, {"p": 1.0}, batch=1, rules={"p": SourceRules(1, "drop", 1000)},
              tasks=lambda src, i: T(f"t{i}"))
    f = o.difficulty["p"]
    f.history = {f"t{i}": [0.0] * 1000 for i in range(200)}
    i, task, again = o._next_task("p")
    assert (i, task.task_id, again) == (MAX_SKIPS, f"t{MAX_SKIPS}", False)
    assert o._entry("p").difficulty_skipped == MAX_SKIPS == len(f.skips)
    assert f"t{MAX_SKIPS}" not in f.skips


def test_reissue_runs_a_stale_task_again_once_then_drops_it():
    async def go():
        rules = {"r": SourceRules(1, "reissue")}
        o = _orch({"r": "ok"}, {"r": 1.0}, batch=1, mode="async", rules=rules, slow=("r",))
        first = o.dispatch("r")
        o.step = 2
        o._evict_stale()  # the group of task 0 went stale: its task is queued again
        again = o.dispatch("r")
        o.step = 3
        o._evict_stale()  # the reissued group went stale too: dropped for good
        out = (first.index, again.index, again.again, list(o.requeue["r"]), o._entry("r").stale_reissued)
        await o.close()
        return out

    assert asyncio.run(go()) == (0, 0, True, [], 1)


SAMPLED = """
[[sources]]
name = "reasoning"
label = "cool"
arms = ["single-turn"]
temperature = 0.6
top_p = 0.9
heldout_tasks = 1
[[sources]]
name = "reasoning"
label = "warm"
arms = ["single-turn"]
temperature = 1.3
top_p = 0.95
top_k = 40
heldout_tasks = 1
"""


def test_each_source_samples_at_its_own_temperature_and_the_trainer_recomputes_at_it(tmp_path):
    """Issue 57, 'Sampling per source': a sync run of two sources at other temperatures and top-p than
    ``[harness]``'s; at step 1 the engine holds the trainer's weights, so the trainer's log-prob of
    every sampled token is the engine's (a trainer at ``harness.temperature`` gives mismatch_kl 6e-3)."""
    import json

    import numpy as np

    from rlonce.recipes.grpo import run
    from rlonce.telemetry.metrics import read_jsonl

    f = tmp_path / "sampled.toml"
    f.write_text(SAMPLED)
    out = tmp_path / "run"
    cfg = load_config(f, [f"out={out}", "sft.demos=0", "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2",
                          "rl.minibatches=1", "algo.filter_no_contrast=false", "eval.every=0",
                          "harness.max_tokens_per_turn=16"])
    run(cfg, progress=False)
    (step,) = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    assert step["step"] == 1 and step["mismatch_tokens"] > 0
    assert 0 <= step["mismatch_kl"] < 1e-6, step["mismatch_kl"]
    # one group of two rows from each source, each row at its source's temperature (both sources draw
    # the same reasoning tasks, so a group id does not tell their rows apart)
    meta = json.loads((out / "rollouts" / "step-0001.json").read_text())
    assert sorted(g["source"] for g in meta["groups"]) == ["cool", "warm"]
    temps = np.load(out / "rollouts" / "step-0001.npz")["temperatures"].tolist()
    assert sorted(temps) == pytest.approx([0.6, 0.6, 1.3, 1.3])


def test_the_orchestrator_counts_staleness_violations_by_each_groups_own_source():
    """The RL loop asks the orchestrator, which keeps the bounds, for the step's violations."""
    from rlonce.core.records import Sample, TrainingRow

    rules = {"code": SourceRules(3, "drop"), "math": SourceRules(1, "drop")}
    o = _orch({"code": "ok", "math": "ok"}, {"code": 0.5, "math": 0.5}, batch=2, rules=rules)
    assert (o.staleness("code"), o.staleness("math"), o.staleness("other")) == (3, 1, 1)
    samples = [Sample("t", "code", 2), Sample("t", "math", 4)]  # one task id, two sources: two groups

    def row(sample, versions):
        n = len(versions) + 1
        return TrainingRow([1] * n, [0] + [1] * len(versions), [0.0] * n, [0.0] * n, [-1] + versions,
                           group_id=sample.group_id)

    rows = [row(samples[0], [5, 4, 3, 2]), row(samples[1], [5, 4, 4])]
    # at version 5: code allows lag ≤ 2 (its lag-3 token breaks it), math lag 0 (two lag-1 tokens)
    assert o.staleness_violations(samples, rows, 5) == 1 + 2
