"""The visual domain end to end: real renders in fresh sandboxes, the replication grade, the tool
arm's workspace, the open-ended family's group hook with a scripted judge, and the config rules."""

import asyncio
import io
import json
import random

import numpy as np
import pytest
from PIL import Image

from rlonce.config import ConfigError, validate
from rlonce.core.records import Sequence
from rlonce.envs.visual.env import VisualEnv
from rlonce.envs.visual.expert import expert_calls
from rlonce.envs.visual.factory import VisualFactory
from rlonce.envs.visual.tasks import make_task
from rlonce.grading.judge import ScriptedJudge
from rlonce.rollout.sources import build_sources, plan_sources

pytestmark = [pytest.mark.browser, pytest.mark.sandbox, pytest.mark.usefixtures("chromium")]


async def _grade(env: VisualEnv, answer: str):
    seq = Sequence(env.task.task_id, "test")
    seq.answer = answer
    try:
        grade = await env.grade(seq)
        seq.metrics.update(env.metrics)  # as the runner does when a sequence ends
        return grade, seq
    finally:
        await env.cleanup()


def test_the_reference_page_scores_one_and_a_flawed_page_less(tmp_path):
    task = make_task("heldout", 3)
    good, _ = asyncio.run(_grade(VisualEnv(task, shots_dir=tmp_path), f"```html\n{task.reference_html}```"))
    assert good.reward == 1.0 and good.passed
    shots = sorted(p.name for p in (tmp_path / "visual_heldout_3").iterdir())
    assert len(shots) == 4 and all(n.endswith(".png") for n in shots)  # 2 viewports x 2 capture delays
    with Image.open(tmp_path / "visual_heldout_3" / shots[0]) as im:
        assert im.size in ((640, 400), (360, 640))
    bar = task.layout.bar
    flawed = task.reference_html.replace(f"background:{bar}", "background:#123456", 1)
    assert flawed != task.reference_html
    worse, _ = asyncio.run(_grade(VisualEnv(task), f"```html\n{flawed}```"))
    assert 0.0 < worse.reward < 1.0 and not worse.passed


def test_the_tool_arm_writes_its_page_beside_the_target_and_submits_the_path():
    task = make_task("heldout", 5)

    async def run():
        env = VisualEnv(task)
        try:
            calls = expert_calls(task, random.Random(0), detour_p=0.0)
            listing = await env.call_tool("bash", {"command": "ls"})
            for c in calls[:-1]:
                await env.call_tool(c.name, c.arguments)
            seq = Sequence(task.task_id, "test")
            seq.answer = calls[-1].arguments["answer"]
            return listing, await env.grade(seq)
        finally:
            await env.cleanup()

    listing, grade = asyncio.run(run())
    assert "target.png" in listing
    assert grade.reward == 1.0 and "read from 'index.html'" in grade.transcript


def _png_size(png: bytes) -> int:
    with Image.open(io.BytesIO(png)) as im:
        return len(np.unique(np.asarray(im.convert("RGB")).reshape(-1, 3), axis=0))  # colours: "richness"


def test_open_family_group_hook_scores_with_the_pick_rounds_and_gates(tmp_path):
    task = make_task("train", 2, family="open")
    assert task.family == "open"
    pages = {"plain": "<p>Hi</p>",
             "rich": '<body style="background:#fde"><h1 style="color:#a13">Bakery</h1><div style="background:#3a7;'
                     'height:90px"></div><button style="background:#fc0">Order</button></body>',
             "broken": '<body style="background:#def"><h1>Bakery</h1><script>console.error("x")</script></body>'}

    def script(kind, prompt, sample, images=()):
        if kind == "visual_query_fit":
            return json.dumps({"score": 0.95, "unmet": []})
        ranked = sorted(images, key=lambda im: _png_size(im[1]))
        return json.dumps({"better": [ranked[-1][0]], "worse": [ranked[0][0]], "reason": "colour"})

    judge = ScriptedJudge(script, record=tmp_path / "calls.jsonl")
    factory = VisualFactory(shots_dir=tmp_path / "shots", judge=judge)

    async def run():
        seqs = []
        for page in pages.values():
            grade, seq = await _grade(factory(task), f"```html\n{page}```")
            seq.set_grade(grade)
            seqs.append(seq)
        await factory.grade_group(task, seqs)
        return seqs

    plain, rich, broken = asyncio.run(run())
    assert broken.metrics["grade/gated"] == 1.0 and broken.reward == 0.0
    assert rich.reward == 1.0  # named better in all 8 rounds: (1 − 0 + 2) / 3
    assert plain.reward == pytest.approx(round((-1 - 0 + 2) / 3, 4))
    assert rich.metrics["grade/visual_rounds_ok"] == 8.0
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert {c["kind"] for c in calls} == {"visual_pick", "visual_query_fit"}
    assert all("base64" not in json.dumps(c) for c in calls)


def _cfg(tmp_path, family: str, judge: dict | None):
    raw = {"out": str(tmp_path / "run"), "task": {"name": "visual", "visual_family": family},
           "harness": {"arms": ["single-turn"]}}
    if judge is not None:
        raw["grading"] = {"judge": judge}
    return validate(raw)


def test_open_tasks_refuse_to_start_without_a_vision_judge(tmp_path, lm):
    from rlonce.rollout.builders import rollout_spec

    for judge in (None, {"kind": "scripted"}):
        cfg = _cfg(tmp_path, "open", judge)
        with pytest.raises(ConfigError, match="grading.judge.vision = true"):
            build_sources(plan_sources(cfg), rollout_spec(cfg, lm), run_dir=tmp_path, grading=cfg.grading)
    cfg = _cfg(tmp_path, "mixed", {"kind": "scripted", "vision": True})
    (src,) = build_sources(plan_sources(cfg), rollout_spec(cfg, lm), run_dir=tmp_path, grading=cfg.grading).values()
    assert src.domain.task("heldout", 2).family == "replication"  # held-out stays gradable alone
    assert src.domain.task("train", 2).family == "open"
    cfg = _cfg(tmp_path, "replication", None)
    build_sources(plan_sources(cfg), rollout_spec(cfg, lm), run_dir=tmp_path, grading=cfg.grading)


@pytest.mark.slow  # 16 renders (~15 s): `make test-slow`
def test_many_grades_at_once_share_the_render_slots_without_stalling():
    """More grades at once than the default thread pool has workers (min(32, cores + 4)): render
    slots are an asyncio semaphore, so waiting for one never holds a worker a render needs."""
    tasks = [make_task("heldout", i) for i in range(8)]

    async def run():
        envs = [VisualEnv(t) for t in tasks]
        return await asyncio.wait_for(asyncio.gather(*(_grade(e, f"```html\n<p>{i}</p>```")
                                                       for i, e in enumerate(envs))), 120)

    grades = asyncio.run(run())
    assert len(grades) == 8 and all(g.reward < 0.5 for g, _ in grades)
