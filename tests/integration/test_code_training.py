"""The code-repair pack as a training domain: the train / held-out split by task id, the scripted
expert through the real harness, sandbox and grader under every tool arm, and SFT demonstrations."""

import asyncio
import dataclasses
import hashlib
import json
import random
import shutil

import pytest

from rlonce.config import TaskConfig
from rlonce.envs.code.validate import validated_tasks
from rlonce.envs.domains import domain_for
from rlonce.envs.packs import SPLIT_RULE, split_tasks
from rlonce.errors import PackError

pytestmark = pytest.mark.sandbox
TOOL_ARMS = ("mini-bash", "mini-claude-code", "mini-codex", "mini-mimocode")


@pytest.fixture(scope="module")
def pack(code_pack):
    """The session's 6-task minicalc pack (``tests/conftest.py``: built and validated once)."""
    return code_pack


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from rlonce.model.loader import EMBEDDED_DIR

    return AutoTokenizer.from_pretrained(EMBEDDED_DIR)


def _unit(task_id: str) -> float:
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big") / 2**64


def test_split_rule_by_hand():
    ids = [f"pkg-{i:04d}" for i in range(1000)]
    s = split_tasks(ids, 0.25)
    assert s["heldout_ids"] == [i for i in ids if _unit(i) < 0.25]
    assert s["train_ids"] == [i for i in ids if _unit(i) >= 0.25]
    assert 200 < len(s["heldout_ids"]) < 300
    # a task's side depends on its own id: dropping or reordering other tasks moves nothing
    sub = split_tasks(list(reversed(ids[::3])), 0.25)
    assert set(sub["heldout_ids"]) == set(s["heldout_ids"]) & set(ids[::3])
    # small packs keep both sides non-empty: the lowest hash is held out, the highest trained on
    lo, hi = sorted(ids[:2], key=_unit)
    assert split_tasks(ids[:2], 1e-9)["heldout_ids"] == [lo]
    assert split_tasks(ids[:2], 1.0)["train_ids"] == [hi]
    assert split_tasks(ids[:1], 1e-9) == {"rule": SPLIT_RULE, "heldout_fraction": 1e-9, "heldout_ids": [],
                                          "train_ids": ids[:1]}


def test_split_is_deterministic_disjoint_complete_and_written_to_validation_json(pack):
    report = json.loads((pack / "validation.json").read_text())
    ids = report["validated_ids"]
    split = report["split"]
    assert split == split_tasks(ids, 0.2) and split["rule"] == SPLIT_RULE
    assert set(split["heldout_ids"]).isdisjoint(split["train_ids"])
    assert sorted(split["heldout_ids"] + split["train_ids"]) == sorted(ids)
    assert split["heldout_ids"] and split["train_ids"]

    dom = domain_for(TaskConfig(name="code", pack=str(pack)))  # a config without heldout_fraction: 0.2
    assert dom.name == "code" and dom.has_expert and not dom.single_turn
    assert dom.env_factory(dom.task("train", 0)).trust_validation  # validated tasks: unchanged is 0 unrun
    n = len(ids)
    held = split["heldout_ids"]
    assert [dom.task("heldout", i).task_id for i in range(2 * n)] == [held[i % len(held)] for i in range(2 * n)]
    assert {dom.task(s, i).task_id for s in ("train", "sft") for i in range(2 * n)} == set(split["train_ids"])
    assert all(dom.task("heldout", i).split == "heldout" for i in range(n))
    assert {t.task_id: t.timeout for t in validated_tasks(pack)}[dom.task("train", 0).task_id] == \
        dom.task("train", 0).timeout  # the validated grading timeout travels with the task

    # another fraction: the same rule, and validation.json says which tasks are held out now
    dom = domain_for(TaskConfig(name="code", pack=str(pack), heldout_fraction=0.5))
    written = json.loads((pack / "validation.json").read_text())["split"]
    assert written == split_tasks(ids, 0.5)
    assert {dom.task("heldout", i).task_id for i in range(2 * n)} == set(written["heldout_ids"])
    domain_for(TaskConfig(name="code", pack=str(pack)))
    assert json.loads((pack / "validation.json").read_text())["split"] == split


def test_a_missing_or_unvalidated_pack_is_one_line_that_says_what_to_run(pack, tmp_path):
    for where in (None, str(tmp_path / "nowhere")):
        with pytest.raises(PackError, match=r"run `rlonce tasks build code --out DIR` and `rlonce tasks validate DIR`"):
            domain_for(TaskConfig(name="code", pack=where))
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in ("pack.json", "tasks.jsonl"):
        shutil.copy(pack / f, raw / f)
    with pytest.raises(PackError, match=f"never validated: run `rlonce tasks validate {raw}`") as e:
        domain_for(TaskConfig(name="code", pack=str(raw)))
    assert "\n" not in str(e.value)


def _spec(tok, arms=("mini-bash",)):
    from rlonce.engine.base import SamplingParams
    from rlonce.harness.loop import HarnessLimits
    from rlonce.model.chat import get_format
    from rlonce.rollout.runner import RolloutSpec

    return RolloutSpec(encode=lambda s: tok.encode(s, add_special_tokens=False), decode=tok.decode,
                       chat_format=get_format("hermes"), sampling=SamplingParams(max_tokens=4096),
                       limits=HarnessLimits(max_turns=64, max_obs_chars=2000), max_context=65536, arms=arms)


def test_the_scripted_expert_passes_every_validated_task_under_every_tool_arm(pack, tok):
    from rlonce.engine.scripted import ScriptedEngine
    from rlonce.envs.code.env import CodeEnv
    from rlonce.envs.code.expert import expert_calls, expert_turns
    from rlonce.harness.arms import get_arm
    from rlonce.rollout.runner import run_sequence

    spec = _spec(tok)
    tasks = validated_tasks(pack)
    runs = [(t, "mini-bash") for t in tasks] + [(tasks[0], a) for a in TOOL_ARMS[1:]]
    rng = random.Random(0)

    async def one(task, arm):
        turns = expert_turns(task, rng, spec.chat_format, translate=get_arm(arm).translate, detour_p=0.6,
                             max_detours=2)
        return await run_sequence(task, CodeEnv, ScriptedEngine(turns, spec.encode), spec, arm=arm), len(turns)

    async def main():
        sem = asyncio.Semaphore(2)

        async def bounded(t, a):
            async with sem:
                return await one(t, a)

        return await asyncio.gather(*(bounded(t, a) for t, a in runs))

    results = asyncio.run(main())
    for (task, arm), (seq, _) in zip(runs, results):
        assert (seq.passed, seq.reward, seq.failure) == (True, 1.0, None), (task.task_id, arm, seq.status, seq.metrics)
        assert seq.metrics["tests_passed"] == seq.metrics["tests_total"] > 0
        assert not any(v for k, v in seq.metrics.items() if k.startswith("intercepted_")), (arm, seq.metrics)
    assert max(n for _, n in results) > 4, "detours on: some demonstration should take more than 4 turns"
    # detours only add calls: without them the expert finds the function, reads it, fixes and submits
    calls = expert_calls(tasks[0], random.Random(1), detour_p=0.0)
    assert [c.name for c in calls] == ["bash", "bash", "str_replace_editor", "submit"]
    # with them, it never reads a hidden test file nor runs a denied command
    many = [c for t in tasks for s in range(20) for c in expert_calls(t, random.Random(s), detour_p=0.9, max_detours=3)]
    assert not any(h in json.dumps(c.arguments) for t in tasks for h in t.hidden_files for c in many)


def test_sft_demonstrations_for_the_code_domain(pack, tok):
    from rlonce.config import load_config
    from rlonce.recipes.sft import demonstrations

    cfg = load_config(None, ["task.name=code", f"task.pack={pack}", "sft.demos=3", "sft.detour_p=0.5",
                             "harness.max_obs_chars=2000"])
    domain = domain_for(cfg.task)
    held = set(json.loads((pack / "validation.json").read_text())["split"]["heldout_ids"])
    spec = dataclasses.replace(_spec(tok, arms=("mini-bash", "mini-codex")), arm_seed=cfg.runtime.seed)
    seqs = asyncio.run(demonstrations(domain, spec, spec.chat_format, spec.encode, cfg, progress=False))
    assert len(seqs) == 3 and all(s.passed and s.reward == 1.0 for s in seqs)
    assert not {s.task_id for s in seqs} & held  # demonstrations never touch a held-out task


class PerSession:
    """A deterministic model for a group whose siblings follow different scripts: a prompt that
    extends no earlier conversation starts the next script; later turns continue their own."""

    def __init__(self, scripts: list[list[str]], encode):
        from rlonce.engine.scripted import ScriptedEngine

        self.engines = [ScriptedEngine(s, encode) for s in scripts]
        self.seen: list[list[int]] = []
        self.version = 0

    async def generate(self, prompt_ids, sampling):
        mine = [i for i, p in enumerate(self.seen) if p and prompt_ids[:len(p)] == p]
        k = max(mine, key=lambda i: len(self.seen[i])) if mine else len(self.seen)
        if k == len(self.seen):
            self.seen.append([])
        out = await self.engines[k].generate(prompt_ids, sampling)
        self.seen[k] = list(prompt_ids) + list(out.token_ids)
        return out

    def load_weights(self, state, version):
        self.version = version

    def pause(self):
        pass

    def resume(self):
        pass


def test_a_hack_route_in_a_code_source_is_intercepted_or_zeroed_and_never_rewarded(pack, tok):
    """One code group of 4 siblings through the real orchestrator, executor, sandbox and grader:
    a shortcut through git history (denied by the interceptor, then the real fix), a library
    patch that reaches into the test runner (a confirmed hack: zeroed before the group's
    statistics), the reference fix, and an empty submission. The hack earns nothing, the ledger
    and the source's metrics count both defences."""
    from rlonce.algo.signal import SignalSettings
    from rlonce.envs.code.expert import expert_turns
    from rlonce.envs.code.routes import ROUTES
    from rlonce.model.chat import ToolCall
    from rlonce.rollout.mixer import SampleMixer, SourceStats
    from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings
    from rlonce.rollout.runner import LocalExecutor
    from rlonce.telemetry.step import StepInputs, source_metrics

    spec = _spec(tok)
    fmt = spec.chat_format
    domain = domain_for(TaskConfig(name="code", pack=str(pack)))
    task = domain.task("train", 0)

    def turns(calls):
        return [fmt.assistant_text("", [ToolCall(n, a)]) for n, a in calls]

    fix = expert_turns(task, random.Random(0), fmt, detour_p=0.0)
    submit = turns([("submit", {"answer": "done"})])
    scripts = [turns(ROUTES["git_log_previous_commit"](task)) + fix,
               turns(ROUTES["library_patches_runner"](task)) + submit, fix, submit]
    engine = PerSession(scripts, spec.encode)

    async def go():
        orch = Orchestrator(LocalExecutor(domain.env_factory, engine, spec), lambda _s, i: domain.task("train", i),
                            SampleMixer({"code": SourceStats(0, share=1.0)}), SignalSettings(zero_hacks=True),
                            OrchestratorSettings(group_size=4, batch=1, refill=False))
        res = await orch.collect(1)
        await orch.close()
        return res

    res = asyncio.run(go())
    seqs = {s.metrics.get("intercepted_git_history", 0) > 0: s for s in res.finished}
    e = res.ledger["code"]
    e.check()
    assert (e.dispatched, e.retained, e.hack_zeroed) == (4, 4, 1)
    hacked = [s for s in res.finished if s.hack_confirmed]
    assert len(hacked) == 1 and hacked[0].reward == 0.0 and not hacked[0].passed
    assert seqs[True].passed and seqs[True].reward == 1.0  # denied, then fixed for real
    assert sorted(s.reward for s in res.finished) == [0.0, 0.0, 1.0, 1.0]
    # advantages: the two fixes +0.5, the hack and the empty submission -0.5 (mean 0.5)
    adv = sorted(round(max(r.advantages, key=abs), 6) for r in res.rows)
    assert adv[0] == -0.5 and adv[-1] == 0.5
    m = source_metrics(StepInputs(step=1, finished=res.finished, trained=[],
                                  ledger={"code": e, "other": type(e)(1, "other")}, rollout_seconds=1.0,
                                  train_seconds=1.0, retained_rows=0, version=1, violations=1,
                                  finished_sources=res.finished_sources, shares={"code": 1.0},
                                  taken_groups={"code": 1}))
    assert m["src/code/hack_zeroed"] == 1.0 and m["src/code/intercepted"] >= 1.0
    assert m["src/code/success_rate"] == 0.5


def test_the_experts_way_to_the_bug_uses_only_what_the_agent_has_seen(pack):
    """Its first call greps the report's function in the file; it then reads windows that start at a
    line grep answers, each where the last ended, the last holding the bug; so a model imitating it
    never has to guess a line number."""
    from rlonce.envs.code.expert import WINDOW_LINES, buggy_text, optimal_calls

    for task in validated_tasks(pack):
        m = task.mut
        grep, *reads, edit, submit = optimal_calls(task)
        name = m.function.split(".")[-1]
        assert name in task.problem and grep.arguments["command"] == f"grep -n 'def {name}(' {m.path}"
        answered = [i for i, line in enumerate(buggy_text(task).splitlines(), 1) if f"def {name}(" in line]
        windows = [tuple(int(x) for x in r.arguments["command"].split("'")[1].removesuffix("p").split(","))
                   for r in reads]
        assert windows[0][0] in answered and windows[-1][0] <= m.line <= windows[-1][1], (task.task_id, windows)
        assert all(b[0] == a[1] + 1 and a[1] - a[0] + 1 == WINDOW_LINES for a, b in zip(windows, windows[1:]))
        assert (edit.name, submit.name) == ("str_replace_editor", "submit")
