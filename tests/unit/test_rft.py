"""Rejection-sampling fine-tuning (issue 58, item 5): which of the model's attempts are kept, every
attempt counted by what became of it, and the settings resolved once per source."""

import pytest

from rlonce.config import ConfigError, load_config
from rlonce.core.records import Context, FailureCategory, Role, Segment, Sequence, Status
from rlonce.recipes.audit import audit
from rlonce.recipes.rft import describe, plan_rft, select
from rlonce.rollout.sources import plan_sources


def attempt(tokens, *, passed=True, status=Status.SUBMITTED, infra=False, suspected=False):
    seg = [Segment(Role.PROMPT, [1, 2]), Segment(Role.MODEL, list(tokens), [-0.5] * len(tokens), [0] * len(tokens))]
    s = Sequence(task_id="t", arm="mini-bash", contexts=[Context(seg)], status=Status.INFRA if infra else status,
                 failure=FailureCategory.SANDBOX_ERROR if infra else None, passed=passed and not infra)
    if suspected:
        s.metrics["hack_suspected"] = 1.0
    return s


def test_select_keeps_distinct_passing_attempts_up_to_keep_and_counts_the_rest():
    a, b, c = attempt([7, 8]), attempt([7, 8]), attempt([7, 9])  # b repeats a's tokens
    task1 = [a, b, c, attempt([5], passed=False)]
    task2 = [attempt([1], passed=False), attempt([2], infra=True), attempt([3], status=Status.LIMITS, passed=False),
             attempt([4], suspected=True)]
    task3 = [attempt([6], passed=False)] * 4
    kept, n = select([task1, task2, task3], keep=1)
    assert kept == [a]  # keep 1: c is over it
    assert n == {"attempts": 12, "infra_failed": 1, "passed": 4, "suspected": 1, "duplicates": 1, "over_keep": 1,
                 "tasks": 3, "tasks_passed": 1, "kept": 1}
    kept, n = select([task1, task2, task3], keep=4)
    assert kept == [a, c] and (n["duplicates"], n["over_keep"], n["kept"]) == (1, 0, 2)
    # every attempt is accounted for: kept + left out + failed + infra
    assert n["kept"] + n["duplicates"] + n["over_keep"] + n["suspected"] + (12 - n["passed"] - 1) + 1 == 12
    line = describe("toolfind", n)
    assert line == ("RFT toolfind: 4 of 11 attempts passed (1 of 3 tasks); kept 2, 1 duplicates left out, "
                    "1 suspected of a hack left out, 1 failed in the infrastructure")


def test_forced_prefix_tokens_do_not_make_attempts_distinct():
    def with_prefix(prefix):
        s = attempt([7, 8])
        s.contexts[0].segments.insert(1, Segment(Role.MODEL, prefix, [0.0] * len(prefix), [0] * len(prefix),
                                                 forced=True))
        return s
    kept, n = select([[with_prefix([1]), with_prefix([2])]], keep=2)
    assert len(kept) == 1 and n["duplicates"] == 1


def test_rft_settings_resolve_once_per_source(tmp_path):
    f = tmp_path / "mixed.toml"
    f.write_text('[rft]\ntasks = 32\nsamples = 8\n[[sources]]\nname = "toolfind"\n'
                 '[[sources]]\nname = "reasoning"\nlabel = "arith"\narms = ["single-turn"]\nrft_tasks = 0\n')
    cfg = load_config(f, ["sft.lr=3e-4"])
    assert [(p.label, p.rft_tasks) for p in plan_sources(cfg)] == [("toolfind", 32), ("arith", 0)]
    plan = plan_rft(cfg)
    assert (plan.samples, plan.keep, plan.epochs, plan.sft.lr, plan.sft.epochs) == (8, 1, 1, 3e-4, 1)
    assert plan_rft(load_config(f, ["rft.lr=1e-5", "rft.epochs=3"])).sft.lr == 1e-5
    assert [p.rft_tasks for p in plan_sources(load_config(None, []))] == [0]  # off by default
    assert [p.rft_tasks for p in plan_sources(load_config(None, ["rft.tasks=5"]))] == [5]


@pytest.mark.parametrize("bad", ["rft.samples=0", "rft.keep=0", "rft.tasks=-1", "rft.lr=0"])
def test_bad_rft_settings_are_one_line_errors(bad):
    with pytest.raises(ConfigError) as e:
        load_config(None, [bad])
    assert bad.split("=")[0] in str(e.value) and "\n" not in str(e.value)


def test_audit_checks_that_rfts_counts_balance_and_its_kept_attempts_are_on_record(tmp_path):
    import json

    (tmp_path / "config.json").write_text("{}")
    assert next(v for v in audit(tmp_path) if v.name == "rft").note == "no RFT"
    counts = {"attempts": 12, "infra_failed": 1, "passed": 4, "suspected": 1, "duplicates": 1, "over_keep": 0,
              "tasks": 3, "tasks_passed": 1, "kept": 2}
    (tmp_path / "rft.json").write_text(json.dumps({"toolfind": counts}))
    (tmp_path / "rft").mkdir()
    kept = [{"task_id": f"t{i}", "status": "submitted", "reward": 1.0} for i in range(2)]
    (tmp_path / "rft" / "step-0000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    v = next(v for v in audit(tmp_path) if v.name == "rft")
    assert v.ok and v.checked == 1
    (tmp_path / "rft.json").write_text(json.dumps({"toolfind": {**counts, "duplicates": 0}}))  # one pass unaccounted
    v = next(v for v in audit(tmp_path) if v.name == "rft")
    assert v.violations == ["source toolfind: 12 attempts = 1 infrastructure + 4 passed + 7 failed, and 4 passed = 2 "
                            "kept + 1 left out: the counts do not balance"]
    (tmp_path / "rft.json").write_text(json.dumps({"toolfind": counts}))
    kept[1] = {"task_id": "t1", "status": "limits", "reward": 0.0}
    (tmp_path / "rft" / "step-0000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept[:2] + kept[:1]))
    v = next(v for v in audit(tmp_path) if v.name == "rft")
    assert v.violations == ["rft.json kept 2 attempts but rft/step-0000.jsonl holds 3",
                            "kept attempts that did not pass: t1"]
