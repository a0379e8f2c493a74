"""On-policy distillation's top-k term (``distill.topk``): KL(teacher ‖ student) over the teacher's k
most likely tokens and the tail, hand-computed; its gradient is p_student − p_teacher on those
bins, so it reaches a token the student never sampled; the teacher's top-k travels from the local
teacher and from an endpoint's reply through records, rows and stored rollouts; at identical
weights the term and its gradient are 0."""

import asyncio
import copy
import json
import math

import numpy as np
import pytest
import torch
from conftest import lm_copy, sampled_turns

from rlonce.algo.losses import topk_kl
from rlonce.algo.signal import SignalSettings, learning_signal
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
from rlonce.distill.endpoint import read_reply
from rlonce.distill.teachers import LocalTeacher, scoring_rows
from rlonce.rollout.sources import check_sources
from rlonce.telemetry.rollouts import _columns
from rlonce.train.trainer import OptimSettings, Trainer, score_tokens


def test_the_term_is_kl_over_the_teachers_top_k_and_the_tail_by_hand():
    # teacher: 0.7, 0.2 on its top-2 (tail 0.1); student: 0.5, 0.3 on them (tail 0.2)
    # KL = 0.7 ln(0.7/0.5) + 0.2 ln(0.2/0.3) + 0.1 ln(0.1/0.2) = 0.2355 − 0.0811 − 0.0693 = 0.0851
    t = torch.tensor([[[math.log(0.7), math.log(0.2)]]])
    s = torch.tensor([[[math.log(0.5), math.log(0.3)]]])
    want = 0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.3) + 0.1 * math.log(0.1 / 0.2)
    assert want == pytest.approx(0.0851228, abs=1e-6)
    assert float(topk_kl(s, t, torch.ones(1, 1))) == pytest.approx(want, abs=1e-6)
    assert float(topk_kl(s, t, torch.zeros(1, 1))) == 0.0  # masked
    # a teacher with no tail (its top-k hold all its mass) adds nothing for the tail bin
    t2 = torch.tensor([[[math.log(0.75), math.log(0.25)]]])
    assert float(topk_kl(s, t2, torch.ones(1, 1))) == pytest.approx(
        0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.3), abs=1e-6)


def test_its_gradient_is_student_minus_teacher_on_the_top_k_and_zero_at_equality():
    torch.manual_seed(0)
    logits = torch.randn(10, requires_grad=True)
    ids = torch.tensor([3, 7, 1])
    p_t = torch.tensor([0.6, 0.25, 0.1])  # the teacher's top-3, tail 0.05
    lp_s = logits.log_softmax(-1)[ids]
    topk_kl(lp_s[None, None], p_t.log()[None, None], torch.ones(1, 1)).sum().backward()
    p_s = logits.detach().softmax(-1)
    assert logits.grad[ids].tolist() == pytest.approx((p_s[ids] - p_t).tolist(), abs=1e-6)
    # outside the top-k: each token's share of the tail's difference, p_s(u)·(1 − tail_t/tail_s)
    rest = torch.tensor([u for u in range(10) if u not in ids.tolist()])
    tail_s = 1 - p_s[ids].sum()
    assert logits.grad[rest].tolist() == pytest.approx((p_s[rest] * (1 - 0.05 / tail_s)).tolist(), abs=1e-6)
    # the student equal to the teacher: value and gradient 0
    logits.grad = None
    lp = logits.log_softmax(-1)
    v = topk_kl(lp[ids][None, None], lp.detach()[ids][None, None], torch.ones(1, 1)).sum()
    v.backward()
    assert float(v.detach()) == pytest.approx(0.0, abs=1e-7) and float(logits.grad.abs().max()) < 1e-6


def _row(topk, mask=(0, 1, 1)):
    return TrainingRow([5, 6, 7], list(mask), [0.0, -1.0, -2.0], [0.0, 0.0, 0.0], [-1, 0, 0], group_id="g",
                       teacher_logprobs=[0.0, -1.0, -1.0], teacher_topk=topk)


def test_records_carry_the_top_k_and_refuse_a_malformed_one():
    pairs = [[(6, -0.5), (9, -1.5)], [(7, -0.1), (2, -3.0)]]
    seg = Segment(Role.MODEL, [6, 7], [-1.0, -2.0], [0, 0], "stop", teacher_logprobs=[-1.0, -1.0], teacher_topk=pairs)
    seq = Sequence("t", "single-turn", [Context([Segment(Role.PROMPT, [5]), seg])], reward=1.0)
    (row,) = sequence_to_rows(seq, 0.5)
    assert row.teacher_topk == [[], *pairs]
    back = sequence_from_dict(json.loads(json.dumps(sequence_to_dict(seq))))
    assert back.contexts[0].segments[1].teacher_topk == pairs
    cols = _columns([row])
    assert cols["teacher_topk_ids"].tolist() == [[-1, -1], [6, 9], [7, 2]]
    assert np.isnan(cols["teacher_topk_logprobs"][0]).all()
    assert cols["teacher_topk_logprobs"][2].tolist() == pytest.approx([-0.1, -3.0])
    for bad in ([[(6, -0.5)], [(7, -0.1), (2, -3.0)]],  # k differs
                [[(6, 0.5), (9, -1.5)], [(7, -0.1), (2, -3.0)]],  # a log-prob above 0
                [[(6, -0.5), (9, math.nan)], [(7, -0.1), (2, -3.0)]],
                [[(-6, -0.5), (9, -1.5)], [(7, -0.1), (2, -3.0)]],
                [[(6, -0.5), (9, -1.5)]]):  # one token short
        with pytest.raises(RecordError, match="top-k"):
            Segment(Role.MODEL, [6, 7], [-1.0, -2.0], [0, 0], teacher_logprobs=[-1.0, -1.0], teacher_topk=bad)
    with pytest.raises(RecordError, match="comes with its log-probs"):
        Segment(Role.MODEL, [6, 7], [-1.0, -2.0], [0, 0], teacher_topk=pairs)
    with pytest.raises(RecordError, match="top-k"):
        _row([[], [(6, -0.5)], []])  # a trained token without its pairs
    _row([[], [(6, -0.5)], [(7, -0.5)]], mask=(0, 1, 0))  # a token the correction masked keeps its pairs


def _reply(entries):
    return json.dumps({"choices": [{"prompt_logprobs": entries}]}).encode()


def test_an_endpoints_top_k_is_its_k_most_likely_entries_and_a_hostile_one_is_refused():
    row = _row(None)
    e = {"6": {"logprob": -2.0, "rank": 3}, "1": {"logprob": -0.3, "rank": 1}, "4": {"logprob": -1.0, "rank": 2}}
    f = {"7": {"logprob": -0.2, "rank": 1}, "3": {"logprob": -4.0, "rank": 2}}
    lps, top = read_reply(_reply([None, e, f]), row, 2, vocab=10)
    assert lps == [0.0, -2.0, -0.2]
    assert top == [[], [(1, -0.3), (4, -1.0)], [(7, -0.2), (3, -4.0)]]  # the own token 6 ranks third: not in
    assert read_reply(_reply([None, e, f]), row)[1] is None  # no top-k asked
    for bad, says in [({**f, "12": {"logprob": -0.1}}, "not a token id of the student's vocabulary"),
                      ({**f, "x1": {"logprob": -0.1}}, "not a token id"),
                      ({**f, "3": {"logprob": 0.5}}, "not a finite number"),
                      ({"7": {"logprob": -0.2}}, "1 entries at position 2"),
                      ({**f, "3": {"logprob": True}}, "not a finite number")]:
        with pytest.raises(ValueError, match=says):
            read_reply(_reply([None, e, bad]), row, 2, vocab=10)


def test_the_local_teachers_top_k_is_the_models_and_the_term_vanishes_at_identical_weights(lm):
    seqs = sampled_turns(lm, lm_copy(lm))
    teacher = LocalTeacher("same", lm.path, batch_tokens=8192, lm=lm_copy(lm), topk=4)
    asyncio.run(teacher.score(seqs))
    rows, _ = scoring_rows(seqs)
    seg = seqs[0].contexts[0].segments[1]
    assert len(seg.teacher_topk) == len(seg.token_ids) and all(len(t) == 4 for t in seg.teacher_topk)
    # the model's own 4 most likely next tokens at the row's temperature, over the whole vocabulary
    ids = torch.tensor([rows[0].token_ids])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, :-1].float() / 0.8
    first = len(rows[0]) - len(seg.token_ids) - 1  # the position that predicts the turn's first token
    want = logits[first].log_softmax(-1).topk(4)
    assert [t for t, _ in seg.teacher_topk[0]] == want.indices.tolist()
    assert [x for _, x in seg.teacher_topk[0]] == pytest.approx(want.values.tolist(), abs=1e-4)
    # student = teacher, rollout log-probs the trainer's: advantage, loss and gradient all 0, the top-k term too
    for s in seqs:
        s.contexts[0].segments[1].logprobs = list(s.contexts[0].segments[1].teacher_logprobs)
    settings = SignalSettings(distill={"src": (1.0, 0.0)})
    rows, _, _ = learning_signal([Sample("t", "src", 1, seqs)], 1, settings)
    assert all(r.teacher_topk is not None for r in rows)
    from rlonce.train.builders import rl_request

    cfg = load_config(None, ["distill.teacher=embedded", "distill.topk=4", "distill.topk_weight=2"])
    req = rl_request(cfg, len(rows), 1, 0)
    assert req.topk_weight == 2.0
    student = copy.deepcopy(lm.model)
    trainer = Trainer(student, OptimSettings(lr=1e-2))
    m = trainer.rl_step(rows, req)
    assert abs(m["distill_topk_kl"]) < 1e-6 and abs(m["loss"]) < 1e-6
    assert all(p.grad is None or float(p.grad.abs().max()) < 1e-5 for p in student.parameters())


def test_the_term_moves_mass_to_a_token_the_student_neversampled_turns(lm):
    """One position, the student's favourite wrong token sampled; the teacher's top-1 is another
    token. The top-k term raises that token's probability in one step; the sampled reverse KL alone
    (top-k off) cannot aim at it."""
    prompt = lm.encode("<|im_start|>user\n3 bits?<|im_end|>\n<|im_start|>assistant\n")
    with torch.no_grad():
        lp = lm.model(input_ids=torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    order = lp.argsort(descending=True).tolist()
    sampled, wanted = order[0], order[50]  # the teacher's answer: a token the student gives little mass

    def rows(topk):
        seg = Segment(Role.MODEL, [sampled], [float(lp[sampled])], [0], "stop", teacher_logprobs=[-20.0],
                      teacher_topk=[[(wanted, math.log(0.98)), (sampled, -20.0)]] if topk else None)
        seq = Sequence("t", "single-turn", [Context([Segment(Role.PROMPT, prompt), seg])], reward=0.0)
        return learning_signal([Sample("t", "src", 1, [seq])], 1, SignalSettings(distill={"src": (0.0, 0.0)}))[0]

    from rlonce.train.builders import rl_request

    gains = {}
    for topk in (0, 1):
        student = copy.deepcopy(lm.model)
        cfg = load_config(None, ["distill.teacher=embedded", f"distill.topk={2 * topk}", "distill.kl_weight=0",
                                 "rl.reward_weight=0"] if topk else [])
        r = rows(topk)
        Trainer(student, OptimSettings(lr=1e-2)).rl_step(r, rl_request(cfg, len(r), 1, 0))
        sc = score_tokens(student, torch.tensor([prompt + [wanted]]), torch.ones(1, len(prompt) + 1))
        gains[topk] = float(sc.lp_BT[0, -1]) - float(lp[wanted])
    assert gains[0] == pytest.approx(0.0, abs=1e-6)  # kl_weight 0, no reward: the step trains nothing
    assert gains[1] > 0.5


def test_topk_settings_are_checked_and_let_a_source_train_on_the_term_alone():
    cfg = load_config(None, ["distill.teacher=embedded", "distill.topk=8", "distill.kl_weight=0",
                             "rl.reward_weight=0"])
    check_sources(cfg)  # the top-k term alone trains
    with pytest.raises(ConfigError, match="trains on nothing"):
        check_sources(load_config(None, ["distill.teacher=embedded", "distill.kl_weight=0", "rl.reward_weight=0"]))
    with pytest.raises(ConfigError, match="topk"):
        load_config(None, ["distill.topk=-1"])
