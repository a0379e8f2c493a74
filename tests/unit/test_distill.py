"""On-policy distillation's learning signal: the per-token reverse-KL advantage (hand-computed), its
weights beside the reward, and the identity case — student = teacher — where the advantage, the
loss and the gradient vanish."""

import asyncio
import copy
import math
import re

import pytest
import torch
from conftest import lm_copy, sampled_turns

from rlonce.algo.signal import SignalSettings, distill_advantages, learning_signal
from rlonce.config import ConfigError, load_config
from rlonce.core.records import (
    Context,
    RecordError,
    Role,
    Sample,
    Segment,
    Sequence,
    TrainingRow,
    sequence_from_dict,
    sequence_to_dict,
    sequence_to_rows,
)
from rlonce.distill.teachers import LocalTeacher
from rlonce.rollout.sources import check_sources


def _seq(reward: float, lps: list[float], teacher: list[float] | None, *, forced: list[int] | None = None) -> Sequence:
    segs = [Segment(Role.PROMPT, [1, 2, 3])]
    if forced:
        segs += [Segment(Role.MODEL, forced, [0.0] * len(forced), [0] * len(forced), "stop", forced=True),
                 Segment(Role.OBSERVATION, [9])]
    segs.append(Segment(Role.MODEL, [4 + i for i in range(len(lps))], lps, [0] * len(lps), "stop",
                        teacher_logprobs=teacher))
    return Sequence("t", "single-turn", [Context(segs)], reward=reward, passed=reward >= 1.0)


def test_each_trained_token_gains_kl_weight_times_teacher_minus_student_log_prob():
    # group of two: rewards 1 and 0 → group advantages +0.5, -0.5; reward_weight 0.5 → ±0.25
    a = _seq(1.0, [-1.5, -1.0], [-1.0, -2.0])
    b = _seq(0.0, [-0.25, -3.0], [-0.75, -0.5])
    settings = SignalSettings(distill={"src": (0.5, 0.5)})
    rows, ledger, stats = learning_signal([Sample("t", "src", 1, [a, b])], 1, settings)
    assert rows[0].loss_mask == [0, 0, 0, 1, 1]
    # a: 0.25 + 0.5·(−1.0 − (−1.5)) = 0.5, 0.25 + 0.5·(−2.0 − (−1.0)) = −0.25
    assert rows[0].advantages == pytest.approx([0, 0, 0, 0.5, -0.25])
    # b: −0.25 + 0.5·(−0.75 + 0.25) = −0.5, −0.25 + 0.5·(−0.5 + 3.0) = 1.0
    assert rows[1].advantages == pytest.approx([0, 0, 0, -0.5, 1.0])
    # the sampled reverse KL: Σ (student − teacher) = (−0.5 + 1.0) + (0.5 − 2.5) = −1.5 over 4 tokens
    assert stats["distill_kl_sum/src"] == pytest.approx(-1.5) and stats["distill_tokens/src"] == 4
    assert ledger["src"].retained == 2
    assert rows[0].teacher_logprobs == [0.0, 0.0, 0.0, -1.0, -2.0]


def test_distill_clip_bounds_each_tokens_log_ratio_in_the_advantage_not_in_the_metric():
    seqs = [_seq(0.0, [-1.0, -0.5], [-25.0, -0.25])]
    rows, _, stats = learning_signal([Sample("t", "src", 1, seqs)], 1,
                                     SignalSettings(distill={"src": (0.5, 0.0)}, distill_clip=3.0))
    assert rows[0].advantages[-2:] == pytest.approx([0.5 * -3.0, 0.5 * 0.25])
    assert stats["distill_kl_sum/src"] == pytest.approx(24.0 - 0.25)  # the metric: unclipped


def test_a_distilled_group_without_reward_contrast_still_trains_on_its_teacher():
    seqs = [_seq(0.0, [-1.0], [-0.5]), _seq(0.0, [-2.0], [-0.5])]
    plain, ledger, _ = learning_signal([Sample("t", "src", 1, copy.deepcopy(seqs))], 1, SignalSettings())
    assert plain == [] and ledger["src"].no_contrast_filtered == 2
    rows, ledger, _ = learning_signal([Sample("t", "src", 1, seqs)], 1, SignalSettings(distill={"src": (1.0, 0.0)}))
    assert ledger["src"].no_contrast_filtered == 0 and ledger["src"].retained == 2
    assert [r.advantages[-1] for r in rows] == pytest.approx([0.5, 1.5])


def test_prefix_turns_are_never_trained_nor_scored_and_survive_a_checkpoint():
    seq = _seq(1.0, [-1.0, -2.0], [-1.0, -1.0], forced=[7, 8])
    (row,) = sequence_to_rows(seq, 0.0)
    assert row.loss_mask == [0, 0, 0, 0, 0, 0, 1, 1]
    assert row.teacher_logprobs == [0.0] * 6 + [-1.0, -1.0]
    back = sequence_from_dict(sequence_to_dict(seq))
    assert [s.forced for s in back.contexts[0].segments] == [False, True, False, False]
    assert back.contexts[0].segments[-1].teacher_logprobs == [-1.0, -1.0]


def test_a_trained_token_without_a_teacher_log_prob_is_refused():
    with pytest.raises(ValueError, match="no teacher log-probs"):
        distill_advantages([TrainingRow([1, 2], [0, 1], [0.0, -1.0], [0.0, 0.0], [-1, 0], group_id="g")], 1.0)
    with pytest.raises(RecordError, match="one finite value per token"):
        Segment(Role.MODEL, [1, 2], [-1.0, -1.0], [0, 0], teacher_logprobs=[-1.0])
    with pytest.raises(RecordError, match="one finite value per token"):
        Segment(Role.MODEL, [1], [-1.0], [0], teacher_logprobs=[math.nan])


def test_at_identical_weights_the_distillation_advantage_loss_and_gradient_are_zero(lm):
    from rlonce.train.builders import rl_request
    from rlonce.train.trainer import OptimSettings, Trainer

    seqs = sampled_turns(lm, lm_copy(lm))
    teacher = LocalTeacher("same", lm.path, batch_tokens=8192, lm=lm_copy(lm))
    asyncio.run(teacher.score(seqs))
    settings = SignalSettings(distill={"src": (1.0, 0.0)})
    rows, _, stats = learning_signal([Sample("t", "src", 1, seqs)], 1, settings)
    trained = [a for r in rows for a, m in zip(r.advantages, r.loss_mask) if m]
    assert len(trained) == stats["distill_tokens/src"] > 20
    # the engine's sampled log-probs against the trainer's code on the same weights: float32 round-off
    assert max(abs(a) for a in trained) < 1e-4
    assert abs(stats["distill_kl_sum/src"]) / len(trained) < 1e-5
    # with the rollout log-probs the trainer's own, every advantage is exactly 0, and so are the
    # loss and the gradient: the optimizer step leaves every weight as it was
    for s in seqs:
        seg = s.contexts[0].segments[1]
        seg.logprobs = list(seg.teacher_logprobs)
    rows, _, _ = learning_signal([Sample("t", "src", 1, seqs)], 1, settings)
    assert all(a == 0.0 for r in rows for a in r.advantages)
    student = copy.deepcopy(lm.model)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    trainer = Trainer(student, OptimSettings(lr=1e-2))
    m = trainer.rl_step(rows, rl_request(load_config(None, []), len(rows), 1, 0))
    assert m["loss"] == 0.0
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in student.parameters())
    assert all(torch.equal(before[k], v) for k, v in student.state_dict().items())


def test_distillation_settings_are_resolved_once_in_the_plan_with_clear_errors():
    cfg = load_config(None, ["distill.teacher=embedded", "distill.prefix=sft", "rl.reward_weight=0"])
    (p,) = check_sources(cfg)
    assert (p.teacher, p.kl_weight, p.reward_weight, p.prefix, p.student_turns) == ("embedded", 1.0, 0.0, "sft", 1)
    (p,) = check_sources(load_config(None, ["distill.teacher=embedded"]))
    assert (p.prefix, p.student_turns, p.reward_weight) == ("none", 0, 1.0)
    with pytest.raises(ConfigError, match="reward_weight 0.5 but no teacher"):
        check_sources(load_config(None, ["rl.reward_weight=0.5"]))
    with pytest.raises(ConfigError, match="trains on nothing"):
        check_sources(load_config(None, ["distill.teacher=embedded", "distill.kl_weight=0", "rl.reward_weight=0"]))
    with pytest.raises(ConfigError, match="an endpoint teacher is the server's OpenAI base URL, ending in /v1"):
        load_config(None, ["distill.teacher=http://127.0.0.1:9/completions"])


def test_an_endpoint_teacher_is_refused_where_it_cannot_score_or_sample():
    url = "http://127.0.0.1:9/v1"
    (p,) = check_sources(load_config(None, [f"distill.teacher={url}/"]))
    assert p.teacher == url and p.distills
    cfg = load_config(None, [f"distill.teacher={url}"])
    assert (cfg.distill.teacher_model, cfg.distill.teacher_timeout_s, cfg.distill.teacher_concurrency) == \
        ("teacher", 600.0, 8)
    for setting, says in [("harness.temperature=0.7", "set harness.temperature = 1.0"),
                          ("harness.top_p=0.9", "set harness.top_p = 1.0"),
                          ("harness.top_k=20", "set harness.top_k = 0"),
                          ("distill.prefix=teacher", "set distill.prefix to 'none' or 'sft'")]:
        with pytest.raises(ConfigError, match=f"has an endpoint teacher \\({url}\\): .*{re.escape(says)}$"):
            check_sources(load_config(None, [f"distill.teacher={url}", setting]))
    check_sources(load_config(None, [f"distill.teacher={url}", "distill.prefix=sft"]))  # the expert's prefixes: fine


def test_teacher_engines_no_prefix_samples_from_are_released_and_rebuilt_on_demand(lm):
    from rlonce.distill.executor import Distillation
    from rlonce.distill.prefixes import Prefixes

    cfg = load_config(None, ["engine.prefix_cache_mb=1"])
    teachers = {k: LocalTeacher(k, lm.path, batch_tokens=8192, lm=lm_copy(lm)) for k in ("ta", "tb")}
    d = Distillation(cfg, teachers, {"a": "ta", "b": "tb"})
    evaluated = d.engine_for("a")  # built for the held-out evaluation only
    d.prefixes["a"] = Prefixes("none", 0)
    d.prefixes["b"] = Prefixes("teacher", 0, teacher_engine=d.engine_for("b"))
    try:
        assert d.release_unused() == ["ta"]
        assert list(d.engines) == ["tb"] and d.engine_for("b") is d.prefixes["b"].teacher_engine
        assert not evaluated._worker.is_alive()  # closed: its thread and its caches are gone
        assert d.engine_for("a") is not evaluated and d.release_unused() == ["ta"]
    finally:
        d.close()
