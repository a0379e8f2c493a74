"""`rlonce view` and report.html without a browser: the page's routes and wording run in Node
(the page's own view.js, with a stub document), group explanations and the storage rule through
the functions that write and read a step record, the report's tables and axes through its
plotting code."""

import html
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlonce.core.records import Context, FailureCategory, Role, Sample, Segment, Sequence, Status, sequence_to_rows
from rlonce.recipes.view import STATIC
from rlonce.recipes.view_data import RunView, explain_group
from rlonce.telemetry.rollouts import read_step, write_step

ALGO = {"norm_by_std": False, "filter_no_contrast": True, "zero_confirmed_hacks": True, "grs": False, "gar": False,
        "length": {"enabled": False}, "mask_unfinished": False,
        "penalties": [{"rule": "repetition", "strategy": "monitor"}, {"rule": "tool_call", "strategy": "monitor"}]}


def run_js(expr: str):
    """``expr`` evaluated in Node after the served view.js, with a document that only records listeners."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install -y nodejs)")
    script = (STATIC / "view.js").read_text()
    prog = ("const vm = require('vm');"
            "const ctx = {document: {addEventListener() {}}, window: {addEventListener() {}}};"
            f"vm.createContext(ctx); vm.runInContext({json.dumps(script)}, ctx);"
            f"process.stdout.write(JSON.stringify(vm.runInContext({json.dumps(expr)}, ctx)));")
    out = subprocess.run([node, "-e", prog], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def _seq(reward: float, *, status=Status.SUBMITTED, hack=False, model=2) -> Sequence:
    ctx = Context([Segment(Role.PROMPT, [1, 2, 3]), Segment(Role.MODEL, [4] * model, [-0.5] * model, [0] * model),
                   Segment(Role.OBSERVATION, [6, 7])])
    if status is Status.INFRA:
        return Sequence("t/1", "mini-bash", [ctx], status, FailureCategory.SANDBOX_ERROR)
    return Sequence("t/1", "mini-bash", [ctx], status, reward=reward, passed=reward > 0, hack_confirmed=hack, turns=1)


def test_a_deep_link_names_a_step_a_sequence_and_its_context():
    """The address forms the page writes are the ones it reads back; anything else names nothing."""
    got = run_js('["#/step/3", "#/step/3/group/2/seq/12", "#/step/3/group/2/seq/12/context/2", "#/compare/1/4",'
                 ' "#/plots", "#/step/x", "#/step/3/seq/1", ""].map(parseRoute)')
    assert got == [
        {"pane": "steps", "step": 3, "group": None, "seq": None, "context": 1},
        {"pane": "steps", "step": 3, "group": 2, "seq": 12, "context": 1},
        {"pane": "steps", "step": 3, "group": 2, "seq": 12, "context": 2},
        {"pane": "compare", "a": "1", "b": "4"}, {"pane": "plots"}, None, None, None]
    js = (STATIC / "view.js").read_text()
    assert 'addEventListener("popstate"' in js  # back, forward and an edited address are followed
    assert "history.pushState" in js and "history.replaceState" in js  # the address follows the user
    assert "await follow(location.hash)" in js  # the page opens what the address names


def test_the_loading_indicator_is_on_the_page_and_shown_while_fetching():
    html = (STATIC / "index.html").read_text()
    assert '<span id="loading" role="status" aria-live="polite" hidden>' in html
    js = (STATIC / "view.js").read_text()
    assert js.count("busy(") >= 4  # the run, a step, a context, a comparison
    assert "placeholder(\"loading the context" in js
    assert "#loading[hidden]" in (STATIC / "view.css").read_text()


def test_a_context_is_described_without_reading_as_a_contradiction():
    trained, untrained = run_js(
        '[describe({kind: "trained", row: 4, tokens: 83, model_tokens: 25, trained_tokens: 20, weight: 1}),'
        ' describe({kind: "untrained", row: 2, tokens: 83, model_tokens: 20, trained_tokens: 0, weight: 1})]')
    assert trained == ("row 4: 83 tokens, of which 20 model tokens trained (5 more sampled but masked); the other 58 "
                       "are prompt and tool output, never trained. Row weight 1")
    assert untrained == ("untrained row 2: 83 tokens, of which 20 sampled from the model and none trained (this "
                         "sequence was not in the step's batch); the other 63 are prompt and tool output")


def _run(tmp_path: Path, algo: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"sources": [], "algo": algo}))
    return run


def test_a_group_header_says_how_its_advantages_were_computed(tmp_path):
    """A group built by hand: four sequences and an infrastructure failure (page #2, never scored);
    #1 passed the tests but was a confirmed hack, so its reward 1 became score 0."""
    seqs = [_seq(1.0), _seq(1.0, hack=True), _seq(0.0, status=Status.INFRA), _seq(0.0), _seq(0.0)]
    sample = Sample("t/1", "toolfind", 1, seqs)
    scores = [1.0, 0.0, 0.0, 0.0]
    adv = [0.75, -0.25, -0.25, -0.25]
    sample.signal = {sample.group_id: {"scores": scores, "passed": [True, True, False, False],
                                       "group_advantages": adv, "advantages": adv, "rows": [0, 1, 2, 3]}}
    rows = [r for s, a in zip([seqs[0], seqs[1], seqs[3], seqs[4]], adv)
            for r in sequence_to_rows(s, a, group_id=sample.group_id)]
    run = _run(tmp_path, ALGO)
    write_step(run, 1, rows, [sample], train_version=0, staleness={"toolfind": 1})
    g = RunView(run).step(1)["groups"][0]
    assert dict(g["explain"]) == {
        "baseline": "the mean of the group's 4 scores, 0.25; 1 infrastructure failure left the group first, unscored",
        "normalisation": "none: advantage = score − baseline (algo.norm_by_std off)",
        "filtering": "kept: its scores differ (dynamic filtering drops a group whose scores are all equal)",
        "reward → score": "#1 1 → 0 (confirmed hack zeroed)",
        "penalties": "repetition, tool_call counted only"}
    assert [(q["index"], q["score"], q["advantage"]) for q in g["sequences"]] == [
        (0, 1.0, 0.75), (1, 0.0, -0.25), (2, None, None), (3, 0.0, -0.25), (4, 0.0, -0.25)]


def test_a_group_header_names_std_normalisation_gar_and_acting_penalties():
    """Scores 1, 0, 0: baseline 1/3, std 0.577; GAR then moved #0's advantage."""
    std = (((1 - 1 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2) ** 0.5
    grouped = [(x - 1 / 3) / (std + 1e-6) for x in (1.0, 0.0, 0.0)]
    g = {"scores": [1.0, 0.0, 0.0], "rewards": [1.0, 0.0, 0.0], "group_advantages": grouped,
         "advantages": [1.5, grouped[1], grouped[2]],
         "sequences": [{"status": "submitted", "hack_confirmed": False}] * 3}
    algo = {**ALGO, "norm_by_std": True, "gar": True, "mask_unfinished": True,
            "penalties": [{"rule": "repetition", "strategy": "mask"}]}
    lines = dict(explain_group(g, algo))
    assert lines["baseline"] == "the mean of the group's 3 scores, 0.333"
    assert lines["normalisation"] == "(score − baseline) / the group's std 0.577 (algo.norm_by_std on)"
    assert lines["reward → score"] == "unchanged: each score is its reward"
    assert lines["after the group"] == "GAR moved advantages among passing sequences: #0 1.15 → 1.5"
    assert lines["penalties"] == ("repetition → mask (flagged tokens' advantage or mask changed); a sequence cut by a "
                                  "budget without a pass gets no rows (algo.mask_unfinished)")
    assert dict(explain_group({**g, "scores": [2.0], "rewards": [2.0], "group_advantages": [2.0],
                               "advantages": [2.0]}, ALGO))["baseline"] == "none: a lone score is its own advantage"


def _job(fraction: float = 0.05):
    return SimpleNamespace(cfg=SimpleNamespace(storage=SimpleNamespace(untrained_fraction=fraction),
                                               runtime=SimpleNamespace(seed=7)))


def test_a_step_that_trained_nothing_stores_every_sequence(tmp_path):
    """24 sequences, none trained: all 24 are stored (the 5 % sample would keep 1); a step that
    trained a group keeps the sample of the rest."""
    from rlonce.recipes.rl import untrained_sample
    from rlonce.rollout.settings import StepResult

    run = _run(tmp_path, ALGO)
    finished = [_seq(0.0) for _ in range(24)]
    nothing = StepResult(rows=[], ledger={}, samples=[], finished=finished, metrics={})
    write_step(run, 1, [], [], train_version=0, staleness={"toolfind": 1},
               untrained=untrained_sample(_job(), nothing, 1))
    meta, cols = read_step(run, 1)
    assert len(meta["untrained"]) == 24 and meta["untrained_rows"] == list(range(24))
    assert len(cols["untrained_row_offsets"]) == 25
    step = RunView(run).step(1)
    assert step["trained_nothing"] and sum(len(g["sequences"]) for g in step["groups"]) == 24
    assert {q["model_tokens"] for g in step["groups"] for q in g["sequences"]} == {2}

    group = [_seq(1.0), _seq(0.0), _seq(0.0), _seq(0.0)]
    sample = Sample("t/2", "toolfind", 2, group)
    rows = sequence_to_rows(group[0], 0.75, group_id=sample.group_id)
    some = StepResult(rows=rows, ledger={}, samples=[sample], finished=group + finished, metrics={})
    kept = untrained_sample(_job(), some, 2)
    assert len(kept) == round(0.05 * 24) == 1 and kept[0] in finished
    assert untrained_sample(_job(), some, 2) == kept  # the same draw each time


def test_nested_summary_values_are_tables_not_json():
    from rlonce.telemetry.report import summary_table

    page = summary_table({"final_success": 0.5, "model": "<tiny>", "harness_arms": ["mini-bash", "single-turn"],
                          "sources": {"toolfind": {"share": 0.75, "heldout_tasks": 8},
                                      "arith": {"share": 0.25, "heldout_tasks": 4}},
                          "final_success_per_arm": {"toolfind/mini-bash": 0.5}, "heldout_change": None})
    assert "{" not in page and "[" not in page
    assert "<th>model</th><td>&lt;tiny&gt;</td>" in page
    assert "<th>harness_arms</th><td>mini-bash, single-turn</td>" in page
    assert ("<table><tr><th></th><th>share</th><th>heldout_tasks</th></tr><tr><th>toolfind</th><td>0.75</td><td>8</td>"
            "</tr><tr><th>arith</th><td>0.25</td><td>4</td></tr></table>") in page
    assert "<th>final_success_per_arm</th><td><table><tr><th>toolfind/mini-bash</th><td>0.5</td></tr></table>" in page
    assert "<th>heldout_change</th><td>—</td>" in page


ROWS = [{"step": 0, "heldout_success": 0.5, "version": 0},
        {"step": 1, "reward_mean": 0.2, "entropy": 0.9},
        {"step": 2, "reward_mean": 0.4, "entropy": 0.8, "heldout_success": 0.25},
        {"step": 3, "reward_mean": 0.5, "entropy": 0.7},
        {"step": 3, "heldout_success": 0.625, "final": True}]


def test_curves_have_whole_step_ticks_and_no_title_of_their_own():
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from rlonce.telemetry.report import _figure

    fig = _figure(ROWS, "entropy", None)
    ax = fig.axes[0]
    assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator)
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert ax.get_title() == ""  # the page's caption is the only title
    plt.close(fig)


def test_heldout_points_of_different_task_counts_are_separate_series():
    import matplotlib.pyplot as plt

    from rlonce.telemetry.report import _figure

    fig = _figure(ROWS, "heldout_success", 0.5, {"baseline": 8, "eval-2": 4, "final": 8})
    series = {ln.get_label(): list(zip(*ln.get_data())) for ln in fig.axes[0].get_lines()}
    assert series == {"baseline and final, n=8 tasks": [(0, 0.5), (3, 0.625)], "mid-run, n=4 tasks": [(2, 0.25)],
                      "baseline level (n=8 tasks)": [(0, 0.5), (1, 0.5)]}
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == list(series)
    plt.close(fig)


def test_the_report_captions_each_curve_once(tmp_path):
    from rlonce.telemetry.report import PLOTS, write_report

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (run / "summary.json").write_text(json.dumps({"baseline_success": 0.5, "sources": {"toolfind": {"share": 1.0}}}))
    (run / "eval" / "eval-2.jsonl").write_text("".join(json.dumps({"source": "s", "task_id": f"t{i}"}) + "\n"
                                                      for i in range(4)))
    page = write_report(run).read_text()
    for _, title, _ in PLOTS:
        assert page.count(html.escape(title)) == 1, title
    assert page.count("<figcaption>") == len(PLOTS)
    assert '<td><table><tr><th></th><th>share</th></tr><tr><th>toolfind</th><td>1</td></tr></table>' in page


def test_an_evaluations_task_count_is_what_its_success_was_scored_on(tmp_path):
    """As heldout_success counts: per source, scored attempts over arms; infrastructure failures out."""
    from rlonce.telemetry.report import eval_task_counts

    (tmp_path / "eval").mkdir()
    rows = [{"source": "a", "task_id": f"t{i}", "arm": arm, "infra_failed": i == 0 and arm == "x"}
            for i in range(3) for arm in ("x", "y")]
    rows.append({"source": "b", "task_id": "u", "arm": "z", "infra_failed": True})
    (tmp_path / "eval" / "final.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert eval_task_counts(tmp_path) == {"final": 2}  # a: 5 scored attempts // 2 arms; b: none scored
    assert eval_task_counts(tmp_path / "nowhere") == {}


def test_a_sparse_policys_experts_are_stored_and_shown_per_token(tmp_path):
    """A context whose routing replay covers its first 6 of 7 tokens (2 layers, top-2): the stored
    step keeps them, -1 past the last; the viewer's context lists them per token, and a token's
    hover names each layer's experts."""
    import numpy as np

    run = _run(tmp_path, ALGO)
    seq = _seq(1.0)
    routes = (np.arange(6 * 2 * 2, dtype=np.uint8).reshape(6, 2, 2) % 8).astype(np.uint8)
    seq.contexts[0].routes = routes
    sample = Sample("t/1", "toolfind", 1, [seq, _seq(0.0)])
    write_step(run, 1, sequence_to_rows(seq, 0.5, group_id=sample.group_id), [sample], train_version=0,
               staleness={"toolfind": 1})
    _, cols = read_step(run, 1)
    assert cols["routes"].shape == (7, 2, 2) and (cols["routes"][6] == -1).all()
    ctx = RunView(run).context(1, 0)
    assert ctx["routes"][:6] == routes.tolist() and ctx["routes"][6] is None
    shown = run_js("(() => { const box = {}; document.getElementById = () => box; state.ctx = " + json.dumps(ctx)
                   + "; hover({target: {closest: () => ({dataset: {i: '5'}})}}); return box.textContent; })()")
    assert shown.endswith("| experts L0:4+5 L1:6+7")
