"""The driver's side of ``[grading]`` under ``executor = "ray"``: the config takes it, each harness
pool takes its share of the judge's concurrency, and what the pools count and send with their
groups (``Judged.grading``) makes the step record as counts made here would (hand-computed)."""

import asyncio
import math
from types import SimpleNamespace

from rlonce.config import load_config
from rlonce.rollout.graded import ROLLOUT_SECONDS, Grading
from rlonce.rollout.groups import Judged


def _cfg(*extra: str):
    return load_config(None, ["executor=ray", "grading.judge.kind=scripted", *extra])


def test_each_harness_pool_takes_an_equal_share_of_the_judges_concurrency(tmp_path):
    cfg = _cfg("grading.judge.concurrency=5", "grading.agreement_judge.kind=scripted")
    shares = {n: Grading(cfg, {}, str, tmp_path, processes=n) for n in (1, 2, 8)}
    assert {n: g.judge.limit._value for n, g in shares.items()} == {1: 5, 2: 2, 8: 1}
    assert shares[2].second.limit._value == 2  # the agreement judge's default concurrency 4, halved


def test_what_harness_pools_send_with_their_groups_makes_the_step_record(tmp_path):
    sent = [{ROLLOUT_SECONDS: 5.0, "grading/groups": 1.0, "grading/seconds": 1.0, "grading/audit_eligible": 4.0,
             "grading/audited": 4.0, "grading/audit_confirmed": 1.0, "grading/agreement_tt": 1.0,
             "grading/agreement_ff": 2.0, "judge_calls": 7.0, "judge_ok": 6.0, "judge_non_json": 1.0,
             "judge_tokens_in": 60.0, "judge_tokens_out": 10.0},
            {ROLLOUT_SECONDS: 1.0, "grading/groups": 1.0, "grading/seconds": 1.0, "grading/audit_eligible": 4.0,
             "grading/audited": 4.0, "grading/audit_confirmed": 1.0, "grading/agreement_ff": 1.0,
             "grading/gar_groups": 1.0, "grading/gar_fallback_down": 1.0, "judge_calls": 5.0, "judge_ok": 4.0,
             "judge_down": 1.0, "judge_tokens_in": 30.0}]

    class Pools:  # the Ray executor: each group comes back judged, with its pool's counts
        async def run_group(self, group, group_size):
            return Judged([], None, {}, grading=sent.pop(0))

    source = SimpleNamespace(domain=SimpleNamespace(env_factory=lambda task: None))
    driver = Grading(_cfg(), {"toolfind": source}, str, tmp_path)
    executor = driver.wrap("toolfind", Pools())
    group = SimpleNamespace(task=None, source="toolfind", dispatch_step=1)
    for _ in range(2):
        asyncio.run(executor.run_group(group, 4))
    rec = driver.step_metrics(rollout_seconds=8.0, train_seconds=2.0, rollout_tokens=100.0, train_tokens=math.nan)
    assert (rec["grading/groups"], rec["grading/audited"], rec["grading/audit_confirmed"]) == (2.0, 8.0, 2.0)
    assert rec["grading/hack_rate"] == 0.25 and rec["grading/audit_coverage"] == 1.0
    assert (rec["judge_calls"], rec["judge_failure_rate"], rec["judge_parse_failure_rate"]) == (12.0, 2 / 12, 1 / 12)
    assert rec["grading/gar_fallback_rate"] == 1.0
    # κ of 1 tt and 3 ff: both raters always agree → po 1, pe 1/16 + 9/16 → κ 1
    assert rec["grading/kappa"] == 1.0 and rec["grading/agreement_rate"] == 1.0
    # the rollout phase's 8 s split by group-seconds: 6 rolling out, 2 grading → 2 s of grading
    assert rec["cost/grading_seconds"] == 2.0 and rec["cost/grading_time_share"] == 0.2
    assert not any(k.endswith("_token_share") for k in rec)  # the trained tokens are not known here
    assert ROLLOUT_SECONDS not in rec and not driver.take_counts()
