"""MOPD2's prefixes in real sandboxes: each sibling of a group replays its first j turns of a
demonstration (or of the teacher's own rollout) through the harness, then the student samples;
the replayed turns are marked forced, never trained, never scored by the teacher."""

import asyncio
import copy
import dataclasses
import random
from collections import Counter

import pytest

from rlonce.algo.signal import SignalSettings, learning_signal
from rlonce.core.records import Role, Sample, Status
from rlonce.distill.executor import DistillExecutor
from rlonce.distill.prefixes import Prefixes
from rlonce.distill.teachers import LocalTeacher
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.domains import domain_for
from rlonce.envs.toolfind.env import ToolfindEnv
from rlonce.envs.toolfind.expert import expert_turns
from rlonce.envs.toolfind.tasks import make_task
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import get_format
from rlonce.rollout.groups import Group
from rlonce.rollout.runner import LocalExecutor, RolloutSpec

pytestmark = pytest.mark.sandbox
FMT = get_format("hermes")
SUBMIT = '<tool_call>\n{{"name": "submit", "arguments": {{"answer": "{}"}}}}\n</tool_call><|im_end|>'


def _spec(lm):
    return RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=FMT, sampling=SamplingParams(max_tokens=96),
                       limits=HarnessLimits(max_turns=12))


def _domain():
    from rlonce.config import TaskConfig

    return domain_for(TaskConfig(name="toolfind"))


def _group(task, step=1):
    return Group(f"toolfind:0@{step}", task, "toolfind", step, 0)


def _forced_and_student(seq):
    model = [s for s in seq.contexts[0].segments if s.role is Role.MODEL]
    return [s for s in model if s.forced], [s for s in model if not s.forced]


def test_sft_prefixes_give_sibling_k_the_first_k_mod_n_expert_turns_then_one_student_turn(lm):
    task = make_task("train", 4)
    domain = _domain()
    n = len(expert_turns(task, random.Random(0), FMT))
    assert n >= 3
    group_size = n + 1
    student = ScriptedEngine([SUBMIT.format("wrong")] * group_size, lm.encode)
    ex = LocalExecutor(ToolfindEnv, student, _spec(lm))
    ex.prefixes = Prefixes("sft", 1, domain=domain, encode=lm.encode, fmt=FMT)
    seqs = asyncio.run(ex.run_group(_group(task), group_size))
    for k, seq in enumerate(seqs):
        forced, own = _forced_and_student(seq)
        assert len(forced) == k % n and len(own) == 1, k
        assert seq.turns == k % n + 1 and seq.status is Status.SUBMITTED and not seq.passed
        assert all(s.logprobs == [0.0] * len(s.token_ids) for s in forced)
    # the replayed turns ran in the sandbox: sibling 2 saw the real output of the expert's first two calls
    obs = [lm.decode(s.token_ids) for s in seqs[2].contexts[0].segments if s.role is Role.OBSERVATION]
    assert len(obs) == 2 and task.chain[0][1] in obs[0]


def test_teacher_prefixes_replay_the_teachers_own_rollout_and_only_student_tokens_train(lm):
    task = make_task("train", 7)
    domain = _domain()
    teacher_turns = expert_turns(task, random.Random(1), FMT)
    teacher_engine = ScriptedEngine(list(teacher_turns), lm.encode)  # one rollout per group and arm
    student = ScriptedEngine([SUBMIT.format(task.answer)] * 3, lm.encode)
    inner = LocalExecutor(ToolfindEnv, student, _spec(lm))
    inner.prefixes = Prefixes("teacher", 0, domain=domain, encode=lm.encode, fmt=FMT, teacher_engine=teacher_engine)
    teacher = LocalTeacher("embedded", lm.path, batch_tokens=8192,
                           lm=dataclasses.replace(lm, model=copy.deepcopy(lm.model)))
    ex = DistillExecutor(inner, teacher, counts := Counter())
    seqs = asyncio.run(ex.run_group(_group(task), 3))
    assert inner.prefixes.teacher_rollouts == 1 and teacher_engine.prompts  # the teacher's rollout ran
    for k, seq in enumerate(seqs):
        forced, own = _forced_and_student(seq)
        assert [lm.decode(s.token_ids) for s in forced] == teacher_turns[:k]
        assert len(own) == 1 and seq.passed  # student_turns 0: the rest of the episode (it submits)
        assert all(s.teacher_logprobs is None for s in forced)
        assert all(len(s.teacher_logprobs) == len(s.token_ids) for s in own)
    assert counts["forced_tokens"] == sum(len(s.token_ids) for q in seqs for s in _forced_and_student(q)[0])
    rows, ledger, stats = learning_signal([Sample(task.task_id, "toolfind", 1, seqs)], 1,
                                          SignalSettings(distill={"toolfind": (1.0, 0.0)}))
    assert ledger["toolfind"].retained == 3
    for seq, row in zip(seqs, rows):
        _, own = _forced_and_student(seq)
        assert sum(row.loss_mask) == len(own[0].token_ids)  # the student's turn only
        # its advantages are the teacher's verdict on the student's (scripted, log-prob 0) tokens
        trained = [(a, t) for a, t, m in zip(row.advantages, row.teacher_logprobs, row.loss_mask) if m]
        assert all(a == pytest.approx(t) for a, t in trained)
    assert stats["distill_tokens/toolfind"] == sum(sum(r.loss_mask) for r in rows)
