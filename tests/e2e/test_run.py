"""A short end-to-end run of a mixed job (two task sources): real model, real sandboxes, real
trainer; then resume it. Further whole jobs (other objectives, mixed arms, kill -9 mid-step) are
marked slow: `make test-slow`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlonce.config import load_config
from rlonce.recipes.grpo import run
from rlonce.telemetry.metrics import read_jsonl

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tiny"
    cfg = load_config(REPO / "configs" / "tiny_mixed.toml", [f"out={out}", "rl.steps=2", "checkpoint.keep=10",
                                                              "tracker.wandb_project=rlonce-tests",
                                                              "storage.untrained_fraction=1"])
    summary = run(cfg, progress=False)
    return out, cfg, summary


def test_run_directory_is_complete(tiny_run):
    out, cfg, summary = tiny_run
    for name in ("config.json", "metrics.jsonl", "ledger.jsonl", "summary.json", "report.html"):
        assert (out / name).is_file(), name
    for key in ("baseline_success", "final_success", "baseline_reward", "final_reward", "heldout_tasks",
                "wall_seconds"):
        assert key in summary
    assert summary["heldout_tasks"] == cfg.eval.heldout_tasks + 4  # toolfind's 8 and arith's own 4
    assert {k: v["heldout_tasks"] for k, v in summary["sources"].items()} == {"toolfind": 8, "arith": 4}
    assert set(summary["final_success_per_arm"]) == {"toolfind/mini-bash", "arith/single-turn"}
    assert json.loads((out / "summary.json").read_text()) == summary
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 12  # 9 curves + retained share, groups and success per source
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("entropy" in r or r["retained_rows"] == 0 for r in steps)
    for r in steps:  # a second turn starts with the first: the engine ran its new tokens only
        assert r["peak_rss_mb"] > 0 and r["prefill_tokens"] > 0
        assert r["prefix_reuse_rate"] > 0 if r["turns_mean"] > 1 else r["prefix_reuse_rate"] >= 0
    assert [(r["src/toolfind/target_share"], r["src/arith/target_share"]) for r in steps] == [(0.75, 0.25)] * 2
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if r["step"] == 0 or r.get("final")]
    assert len(evals) == 2
    assert [r["heldout_reward"] for r in evals] == [summary["baseline_reward"], summary["final_reward"]]
    for r, key in zip(evals, ("baseline_success", "final_success")):
        assert {k: r[f"src/{k}/heldout_success"] for k in ("toolfind", "arith")} == {
            k: v[key] for k, v in summary["sources"].items()}
    for name, key in (("baseline", "baseline_success"), ("final", "final_success")):  # every attempt, kept
        rows = read_jsonl(out / "eval" / f"{name}.jsonl")
        for src, v in summary["sources"].items():
            mine = [r for r in rows if r["source"] == src and not r["infra_failed"]]
            assert len(mine) == v["heldout_tasks"] and sum(r["passed"] for r in mine) / len(mine) == v[key]
    change = summary["heldout_change"]
    assert change["attempts"] == summary["heldout_tasks"] and change["passed_change_se"] >= 0


def test_ledger_balances(tiny_run):
    out, cfg, _ = tiny_run
    ledger = read_jsonl(out / "ledger.jsonl")
    assert [(e["step"], e["source"]) for e in ledger] == [(1, "toolfind"), (1, "arith"), (2, "toolfind"), (2, "arith")]
    g = cfg.rl.group_size
    # each step's targets: 2 groups split 3 : 1 in whole groups (wants 1.5 / 0.5: the tie goes to
    # 'arith' by name, then the carried 0.5 / -0.5 make 2 / 0)
    for e, want in zip(ledger, (1, 1, 2, 0)):
        # a sync step dispatches its groups, then refills the ones filtering dropped, within the cap
        assert want * g <= e["dispatched"] <= cfg.rollout.sync_dispatch_cap * want * g and e["dispatched"] % g == 0
        assert e["retained"] + e["groups_short"] * g == want * g  # the promised batch, or its shortfall counted
        assert e["dispatched"] == e["finished"] + e["infra_failed"]
        assert (e["carried_in"] + e["finished"] == e["no_contrast_filtered"] + e["penalty_rejected"] + e["retained"]
                + e["stale_dropped"] + e["carried_over"])


def test_parameters_changed_and_checkpoint_is_a_hf_model(tiny_run):
    out, _, _ = tiny_run
    init = load_file(out / "cache" / "embedded-init" / "model.safetensors")
    sft = load_file(sorted((out / "checkpoints").glob("step-0000"))[0] / "model.safetensors")
    final = load_file(sorted((out / "checkpoints").glob("step-*"))[-1] / "model.safetensors")
    assert any(not torch.equal(init[k], sft[k]) for k in init)  # SFT moved the weights
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(sorted((out / "checkpoints").glob("step-*"))[-1])
    assert sum(p.numel() for p in model.parameters()) > 1_000_000
    metrics = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    summary = json.loads((out / "summary.json").read_text())
    if any(r["retained_rows"] for r in metrics):  # some group had contrast: RL moved the weights
        assert any(not torch.equal(sft[k], final[k]) for k in sft)
        assert summary["policy_version"] == sum(1 for r in metrics if r["retained_rows"])
    else:  # nothing to learn from: no update, no new version
        assert all(torch.equal(sft[k], final[k]) for k in sft) and summary["policy_version"] == 0


def test_trajectories_are_recorded(tiny_run):
    out, cfg, _ = tiny_run
    rows = read_jsonl(out / "trajectories" / "step-0001.jsonl")
    assert len(rows) == cfg.rl.group_size
    assert all("<|im_start|>assistant" in r["text"] for r in rows)


def _tensorboard(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_trackers_get_the_same_numbers_as_metrics_jsonl(tiny_run):
    """TensorBoard event files (always) and an offline W&B run (configured) hold every number of every
    metrics.jsonl record, at its step, under its flattened name."""
    from rlonce.telemetry.trackers import scalars

    out, _, _ = tiny_run
    records = read_jsonl(out / "metrics.jsonl")
    tb = _tensorboard(out)
    want: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for k, v in scalars(r).items():
            want.setdefault(k, []).append((r["step"], v))
    assert "src/toolfind/retained_share" in want and "heldout_success" in want
    assert set(tb) == set(want)
    for k, pts in want.items():
        assert [s for s, _ in tb[k]] == [s for s, _ in pts], k
        assert [v for _, v in tb[k]] == pytest.approx([v for _, v in pts], rel=1e-6, abs=1e-6), k
    by_step: dict[int, dict[str, float]] = {}  # W&B keeps one row per step: records of a step merge
    for r in records:
        by_step.setdefault(r["step"], {}).update(scalars(r))
    history = _wandb_history(out)
    assert [h["_step"] for h in history] == sorted(by_step)
    for h in history:
        want = by_step[h["_step"]]
        assert {k: h[k] for k in want} == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert "WANDB_API_KEY" not in (out / "config.json").read_text()


def _wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of the run's one offline W&B run, read from its transaction log (W&B's
    LevelDB-log framing: 32 KiB blocks of 7-byte-headed chunks, after a 7-byte file header) with
    W&B's own protobuf ``Record``: what `wandb sync` would upload."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, block, records, part = log.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):  # block trailer or padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):  # a whole record, or the last chunk of one
            records.append(part)
    rows = []
    for raw in records:
        r = pb.Record()
        r.ParseFromString(raw)
        if r.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    return rows


def test_resume_continues_from_the_last_checkpoint(tiny_run, tmp_path):
    out, _, _ = tiny_run
    import shutil

    copy = tmp_path / "resumed"
    shutil.copytree(out, copy)
    prov = json.loads((copy / "provenance.json").read_text())
    assert prov["config_sha256"] and prov["code"]["source_sha256"] and prov["model"]["weights_sha256"]
    assert prov["machine"]["cpus"] and prov["machine"]["torch"].startswith("2.13")
    ckpt = json.loads((copy / "checkpoints" / "step-0002" / "provenance.json").read_text())
    assert ckpt == {"config_sha256": prov["config_sha256"], "code_sha256": prov["code"]["source_sha256"]}

    def resume(*extra):
        return subprocess.run([sys.executable, "-m", "rlonce.cli", "train", "--resume", str(copy), "rl.steps=3",
                               "--quiet", *extra], capture_output=True, text=True, timeout=600)

    r = resume("algo.kl_coef=0.1")  # changes what training means: refused, one line, nothing touched
    assert r.returncode == 2 and "algo.kl_coef" in r.stderr and "--accept-changes" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and json.loads((copy / "provenance.json").read_text()) == prov
    tampered = {**prov, "code": {**prov["code"], "source_sha256": "0" * 64}}  # as if the code had changed
    (copy / "provenance.json").write_text(json.dumps(tampered))
    r = resume()
    assert r.returncode == 2 and "code" in r.stderr and "changed since the run started" in r.stderr, r.stderr
    r = resume("--accept-changes")
    assert r.returncode == 0, r.stderr[-2000:]
    (resumed,) = json.loads((copy / "provenance.json").read_text())["resumes"]
    assert resumed["at_step"] == 2 and resumed["code_changed"] and resumed["accepted_config_changes"] == {}
    steps = [x["step"] for x in read_jsonl(copy / "metrics.jsonl") if "reward_mean" in x]
    assert steps == [1, 2, 3]
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["rl_steps"] == 3
    assert (copy / "checkpoints" / "step-0003").is_dir()
    tb = _tensorboard(copy)  # the resumed run's events carry on: each step once
    assert [s for s, _ in tb["reward_mean"]] == [1, 2, 3]


@pytest.mark.slow  # another whole job: the default suite keeps one smoke run (tiny_run) and its resume
@pytest.mark.parametrize("overrides, expect", [
    (["algo.objective=four_bound", "algo.objective.entropy_band=[5.0, 6.0]", "algo.rollout_correction=token"],
     ("clip_pos_high", "clip_neg_low", "bound_pos_high", "correction_capped_frac")),
    (["algo.objective=cispo", "algo.aggregation=prompt-mean", "algo.length.enabled=true",
      "algo.penalties=[{rule = 'tool_call', strategy = 'adv_signed'}]"],
     ("clipfrac", "penalty_tool_call_segments", "length_deduction_sum")),
])
def test_other_objectives_train_from_the_sft_checkpoint(tiny_run, tmp_path, overrides, expect):
    out, _, _ = tiny_run
    sft = out / "checkpoints" / "step-0000"
    cfg = load_config(REPO / "configs" / "tiny.toml", [f"out={tmp_path / 'run'}", f"model.name={sft}", "sft.demos=0",
                                                       "rl.steps=2", "rl.tasks_per_step=6", *overrides])
    summary = run(cfg, progress=False)
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward_mean" in r]
    trained = [r for r in steps if r["retained_rows"]]
    assert trained, "no group had contrast in 2 steps of 6 tasks × 4 sequences"
    assert summary["policy_version"] == len(trained)
    for r in trained:
        assert all(k in r for k in expect), sorted(r)
    if "bound_pos_high" in expect:  # entropy far below the band: positive interval widens
        assert trained[0]["bound_pos_high"] > 5.0 and trained[0]["bound_neg_high"] < 5.0


@pytest.mark.slow  # another whole job: the default suite keeps one smoke run (tiny_run) and its resume
def test_a_run_can_mix_harness_arms(tmp_path):
    """`harness.arms` in `rlonce train`: SFT demonstrations and RL groups are spread over the arms,
    held-out success is reported per arm, every recorded sequence names its arm."""
    out = tmp_path / "arms"
    cfg = load_config(REPO / "configs" / "tiny.toml", [
        f"out={out}", "rl.steps=1", "sft.demos=64", "sft.epochs=1", "rl.tasks_per_step=4", "rl.group_size=2",
        "eval.heldout_tasks=4", "eval.every=0", "harness.arms=[mini-bash,mini-claude-code,mini-codex,mini-mimocode]"])
    summary = run(cfg, progress=False)
    assert set(summary["final_success_per_arm"]) == set(cfg.harness.arms) == set(summary["baseline_success_per_arm"])
    assert summary["heldout_infra_failed"] == 0
    trajs = read_jsonl(out / "trajectories" / "step-0001.jsonl")
    assert {t["arm"] for t in trajs} <= set(cfg.harness.arms) and len({t["arm"] for t in trajs}) == 1  # one group


@pytest.mark.slow  # another whole job: the default suite keeps one smoke run (tiny_run) and its resume
def test_async_run_survives_kill_9_mid_step_without_losing_or_double_counting(tiny_run, tmp_path):
    """Continue the tiny mixed run in async mode, kill -9 the process mid-run, resume it: every
    step's ledger appears once per source, balances, and carries into the source's next step
    exactly what its step before carried over; trained tokens span versions only within the
    staleness bound."""
    import shutil
    import time

    out, _, _ = tiny_run
    run_dir = tmp_path / "killed"
    shutil.copytree(out, run_dir)
    cmd = [sys.executable, "-m", "rlonce.cli", "train", "--resume", str(run_dir), "--quiet"]
    steps = 16
    proc = subprocess.Popen([*cmd, f"rl.steps={steps}", "rollout.mode=async", "rollout.target_groups=1",
                             "rollout.max_sessions=16", "checkpoint.every=1", "eval.every=0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            if len(read_jsonl(run_dir / "ledger.jsonl")) >= 8:  # 4 steps × 2 sources
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.3)  # into the next step
        proc.kill()  # SIGKILL: no clean-up, no final checkpoint
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(read_jsonl(run_dir / "ledger.jsonl")) < 2 * steps  # the kill interrupted the run
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    assert [(e["step"], e["source"]) for e in ledger] == [(s, n) for s in range(1, steps + 1)
                                                          for n in ("toolfind", "arith")]
    for n in ("toolfind", "arith"):
        mine = [e for e in ledger if e["source"] == n]
        for prev, e in zip(mine, mine[1:]):
            assert e["carried_in"] == prev["carried_over"], (prev, e)
    for e in ledger:
        assert e["carried_in"] + e["dispatched"] == (e["infra_failed"] + e["no_contrast_filtered"]
                                                     + e["penalty_rejected"] + e["stale_dropped"] + e["retained"]
                                                     + e["carried_over"])
    metrics = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "reward_mean" in m]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert all(m["staleness_violations"] == 0 for m in metrics[2:])
    assert json.loads((run_dir / "summary.json").read_text())["rl_steps"] == steps


def test_audit_passes_on_the_run_and_names_each_injected_corruption(tiny_run, tmp_path):
    """`rlonce audit` checks every trained token, the ledgers, the groups, the advantages and the
    checkpoints of the smoke run; each corruption injected into a copy fails its check, named."""
    import shutil

    import numpy as np

    from rlonce.recipes.audit import audit

    out, _, _ = tiny_run
    verdicts = {v.name: v for v in audit(out)}
    assert all(v.ok for v in verdicts.values()), [v.line() for v in verdicts.values() if not v.ok]
    assert verdicts["tokens"].checked > 100 and verdicts["advantages"].checked > 0
    size = sum(p.stat().st_size for p in (out / "rollouts").glob("step-*"))  # what storing it all costs
    assert verdicts["tokens"].note == (f"storage {size / 1e6:.2f} MB, {size / verdicts['tokens'].checked:.1f} B per "
                                       "trained token")
    assert verdicts["checkpoints"].checked >= 2

    def corrupt(name, change):
        copy = tmp_path / name
        shutil.copytree(out, copy)
        change(copy)
        r = subprocess.run([sys.executable, "-m", "rlonce.cli", "audit", str(copy)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 1, r.stdout
        return {line.split()[1]: line for line in r.stdout.splitlines() if line.startswith("[FAIL]")}

    def versionless_token(run):
        path = run / "rollouts" / "step-0001.npz"
        with np.load(path) as z:
            cols = {k: z[k] for k in z.files}
        cols["policy_versions"][int(np.flatnonzero(cols["loss_mask"])[0])] = -1
        np.savez_compressed(path, **cols)

    failed = corrupt("no-version", versionless_token)
    assert list(failed) == ["tokens"] and "bad version, first -1" in failed["tokens"]

    def unbalanced(run):
        lines = (run / "ledger.jsonl").read_text().splitlines()
        e = json.loads(lines[0])
        e["retained"] += 1
        (run / "ledger.jsonl").write_text("\n".join([json.dumps(e)] + lines[1:]) + "\n")

    failed = corrupt("unbalanced", unbalanced)
    assert "ledger" in failed and "step 1 toolfind: carried_in" in failed["ledger"]

    def trained_twice(run):
        a = json.loads((run / "rollouts" / "step-0001.json").read_text())
        b_path = run / "rollouts" / "step-0002.json"
        b = json.loads(b_path.read_text())
        b["groups"].append(a["groups"][0])
        b_path.write_text(json.dumps(b))

    failed = corrupt("twice", trained_twice)
    assert "no" in failed and "trained at steps 1 and 2" in failed["no"]


def test_rollouts_keep_outcomes_and_the_untrained_sample(tiny_run):
    """Each stored group has every sequence's outcome and grader breakdown; with
    storage.untrained_fraction=1 every sequence the step did not train is kept too, its contexts
    whole (what the agent saw and ran) with advantage 0."""
    from rlonce.telemetry.rollouts import read_step, stored_steps

    out, _, _ = tiny_run
    ledger = read_jsonl(out / "ledger.jsonl")
    kept = 0
    for step in stored_steps(out):
        meta, cols = read_step(out, step)
        for g in meta["groups"]:
            assert len(g["sequences"]) == len(g["rewards"]) and all("metrics" in q for q in g["sequences"])
        dropped = sum(e["no_contrast_filtered"] + e["infra_failed"] for e in ledger if e["step"] == step)
        assert len(meta["untrained"]) >= dropped
        assert len(cols["untrained_row_offsets"]) - 1 == len(meta["untrained_rows"])
        assert not cols["untrained_advantages"].any()
        kept += len(meta["untrained"])
    assert kept > 0


def test_rollouts_keep_the_trainers_logprob_of_each_trained_token(tiny_run):
    """``trainer_logprobs``: the local trainer's log-prob of each trained token when its gradient
    was taken. With one mini-batch a step (sync, lag 0) those are the weights that sampled it, so
    it equals the rollout log-prob within the engine/trainer numeric gap; NaN off the loss mask."""
    import numpy as np

    from rlonce.telemetry.rollouts import read_step, stored_steps

    out, cfg, _ = tiny_run
    assert cfg.rl.minibatches == 1
    checked = 0
    for step in stored_steps(out):
        _, cols = read_step(out, step)
        t, r, m = cols["trainer_logprobs"], cols["rollout_logprobs"], cols["loss_mask"] == 1
        assert len(t) == len(r) and np.isnan(t[~m]).all() and np.isfinite(t[m]).all()
        assert np.abs(t[m] - r[m]).max() < 1e-3, np.abs(t[m] - r[m]).max()
        checked += int(m.sum())
    assert checked > 100

def test_stored_outcomes_carry_the_graders_transcript(tiny_run):
    """Each graded sequence's outcome says in words what its grader saw and decided: toolfind's
    submitted answer against the expected one, arithmetic's answer against the gold one."""
    from rlonce.telemetry.rollouts import read_step, stored_steps

    out, _, _ = tiny_run
    seen = set()
    for step in stored_steps(out):
        meta, _ = read_step(out, step)
        for q in [q for g in meta["groups"] for q in g["sequences"]] + meta["untrained"]:
            if q["status"] == "infra":
                assert q["transcript"] == ""
                continue
            domain = q["task_id"].split("/")[0]
            want = {"toolfind": "; expected ", "chain_sum": "; gold "}[domain]
            assert want in q["transcript"] and q["transcript"].endswith(
                ("correct", "wrong") if domain == "toolfind" else f"reward {q['reward']:g}"), q["transcript"]
            seen.add(domain)
    assert seen == {"toolfind", "chain_sum"}

def test_view_api_shows_a_sequence_as_its_stored_columns(tiny_run):
    """`rlonce view`'s API over a real loopback connection: steps, groups, a sequence's context.
    Its token count, trained-token count, token ids, versions and advantages equal the stored
    columns; its pieces join to the run tokenizer's text; its turns cover it in order."""
    import httpx
    import numpy as np

    from rlonce.gateway.server import ServerThread
    from rlonce.model.loader import load
    from rlonce.recipes.view import make_app
    from rlonce.recipes.view_data import RunView
    from rlonce.telemetry.rollouts import read_step, stored_steps

    out, _, _ = tiny_run
    meta, cols = read_step(out, 1)
    with ServerThread(make_app(RunView(out))) as srv, httpx.Client(base_url=srv.base_url, timeout=120) as http:
        run = http.get("/api/run").json()
        step = http.get("/api/steps/1").json()
        trained = [g for g in step["groups"] if g["kind"] == "trained"]
        g = trained[0]
        q = next(q for q in g["sequences"] if q["retained"])
        row = q["rows"][0]
        ctx = http.get(f"/api/steps/1/rows/{row}").json()
        untrained = [(g, q) for g in step["groups"] if g["kind"] == "untrained" for q in g["sequences"] if q["rows"]]
        spare = http.get(f"/api/steps/1/untrained/{untrained[0][1]['rows'][0]}").json()
        png = http.get("/api/plots/0.png")
        missing = [http.get(p).status_code for p in ("/api/steps/99", f"/api/steps/1/rows/{len(meta['rows'])}")]
    assert [s["step"] for s in run["steps"]] == stored_steps(out) == [1, 2] and len(run["plots"]) == 12
    assert [g["group_id"] for g in trained] == [g["group_id"] for g in meta["groups"]]
    a, b = int(cols["row_offsets"][row]), int(cols["row_offsets"][row + 1])
    mask = cols["loss_mask"][a:b].astype(bool)
    assert ctx["tokens"] == b - a == len(ctx["pieces"]) and ctx["trained_tokens"] == int(mask.sum()) > 0
    assert ctx["token_ids"] == cols["token_ids"][a:b].tolist()
    assert ctx["versions"] == cols["policy_versions"][a:b].tolist()
    want = meta["groups"][0]["advantages"][meta["rows"][row]["sequence"]]
    assert q["advantage"] == want and np.allclose(np.array(ctx["advantages"])[mask], want)
    if "trainer_logprobs" in cols:  # the local trainer's log-probs: null where it computed none (NaN)
        t = cols["trainer_logprobs"][a:b]
        assert step["trainer_logprobs"] and [x is None for x in ctx["trainer_logprobs"]] == np.isnan(t).tolist()
        assert np.allclose([x for x in ctx["trainer_logprobs"] if x is not None], t[~np.isnan(t)])
    else:
        assert ctx["trainer_logprobs"] is None and step["trainer_logprobs"] is False
    lm = load(sorted((out / "checkpoints").glob("step-*"))[-1], weights=False)
    assert "".join(ctx["pieces"]) == lm.decode(ctx["token_ids"])
    segs = ctx["segments"]
    assert segs[0]["role"] == "prompt" and segs[0]["start"] == 0 and segs[-1]["end"] == b - a
    assert all(x["end"] == y["start"] for x, y in zip(segs, segs[1:]))
    assert all((min(ctx["versions"][s["start"]:s["end"]]) >= 0) == (s["role"] == "model") for s in segs)
    ua, ub = (int(x) for x in cols["untrained_row_offsets"][spare["row"]:spare["row"] + 2])
    assert spare["tokens"] == ub - ua and spare["token_ids"] == cols["untrained_token_ids"][ua:ub].tolist()
    assert spare["outcome"] == meta["untrained"][meta["untrained_rows"][spare["row"]]]
    assert png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG")
    assert missing == [404, 404]


def test_view_shows_trainer_logprobs_only_where_the_run_stored_them(tiny_run, tmp_path):
    """A run with a ``trainer_logprobs`` column (NaN where not computed) gets it per token, NaN as
    null; a run without it says so (``None``), never a made-up number."""
    import shutil

    import numpy as np

    from rlonce.recipes.view_data import RunView

    out, _, _ = tiny_run
    views = {}
    for name in ("with", "without"):
        copy = tmp_path / name
        shutil.copytree(out, copy, ignore=shutil.ignore_patterns("checkpoints", "wandb", "tensorboard"))
        path = copy / "rollouts" / "step-0001.npz"
        with np.load(path) as z:
            cols = {k: z[k] for k in z.files if k != "trainer_logprobs"}
        if name == "with":
            trained = cols["loss_mask"] == 1
            cols["trainer_logprobs"] = np.where(trained, cols["rollout_logprobs"] - 0.25, np.nan).astype(np.float32)
        np.savez_compressed(path, **cols)
        views[name] = RunView(copy)
    ctx, plain = views["with"].context(1, 0), views["without"].context(1, 0)
    a, b = int(cols["row_offsets"][0]), int(cols["row_offsets"][1])
    mask = cols["loss_mask"][a:b] == 1
    gap = np.array([t - r for t, r, m in zip(ctx["trainer_logprobs"], ctx["rollout_logprobs"], mask) if m])
    assert len(gap) == mask.sum() > 0 and np.allclose(gap, -0.25, atol=1e-5)
    assert all(t is None for t, m in zip(ctx["trainer_logprobs"], mask) if not m)
    assert views["with"].step(1)["trainer_logprobs"] and not views["without"].step(1)["trainer_logprobs"]
    assert plain["trainer_logprobs"] is None and plain["rollout_logprobs"] == ctx["rollout_logprobs"]
    assert ctx["pieces"][0].startswith("⟨")  # no checkpoint copied: token ids shown, and said
    assert "no checkpoint" in ctx["tokenizer"]


def test_a_run_with_model_graders_reports_what_they_did(tmp_path):
    """`[grading]` in `rlonce train`: the scripted judge audits a share of the sequences and
    compares passing attempts of mixed groups; every call is in RUN/grading/calls.jsonl, the step
    records count calls, audits and cost shares, the summary totals them and the report plots
    them. The agreement judge is an endpoint that is down: the run goes on, each of its calls is
    counted as 'down' and no agreement pair is made of it."""
    out = tmp_path / "graded"
    cfg = load_config(REPO / "configs" / "tiny.toml", [
        f"out={out}", "rl.steps=1", "sft.demos=32", "sft.epochs=1", "eval.heldout_tasks=4", "eval.every=0",
        "grading.judge.kind=scripted", "algo.gar=true", "grading.audit_fraction=0.5", "grading.agreement_fraction=1",
        "grading.agreement_judge.kind=endpoint", "grading.agreement_judge.base_url=http://127.0.0.1:9/v1",
        "grading.agreement_judge.retries=0"])
    summary = run(cfg, progress=False)
    rec = next(r for r in read_jsonl(out / "metrics.jsonl") if r.get("reward_mean") is not None)
    calls = [json.loads(x) for x in (out / "grading" / "calls.jsonl").read_text().splitlines()]
    assert rec["judge_calls"] + rec["agreement_judge_calls"] == len(calls) and rec["judge_ok"] == rec["judge_calls"] > 0
    assert rec["grading/audited"] == rec["grading/audited/toolfind"] > 0
    assert rec["grading/audit_coverage"] == rec["grading/audited"] / rec["grading/audit_eligible"]
    assert rec["grading/agreement_fallback_down"] == rec["agreement_judge_down"] == rec["grading/audited"]
    assert not any(k.startswith("grading/agreement_") and k[-3:] in ("_tt", "_tf", "_ft", "_ff") for k in rec)
    mine = [c for c in calls if c["judge"] == "judge"]
    assert {c["kind"] for c in mine} <= {"hack", "gar"} and sum(c["kind"] == "hack" for c in mine) == \
        rec["grading/audited"]
    assert rec.get("grading/gar_groups", 0) == sum(c["kind"] == "gar" for c in mine)
    assert [c["outcome"] for c in calls if c["judge"] == "agreement"] == ["down"] * int(rec["grading/audited"])
    shares = [rec[f"cost/{k}_time_share"] for k in ("rollout", "grading", "train")]
    assert abs(sum(shares) - 1) < 1e-9 and all(0 <= x <= 1 for x in shares)
    assert summary["grading"]["judge_calls"] == rec["judge_calls"] and summary["grading"]["grading/hack_rate"] == 0.0
    assert "Hack audit" in (out / "report.html").read_text()


def test_an_evaluate_only_run_evaluates_once_and_keeps_it_as_final(tmp_path):
    out = tmp_path / "eval-only"
    cfg = load_config(REPO / "configs" / "tiny_mixed.toml", [f"out={out}", "sft.demos=0", "rl.steps=0",
                                                              "eval.heldout_tasks=4"])
    summary = run(cfg, progress=False)
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if "heldout_success" in r]
    assert len(evals) == 2 and not any("reward_mean" in r for r in read_jsonl(out / "metrics.jsonl"))
    assert (out / "eval" / "final.jsonl").read_bytes() == (out / "eval" / "baseline.jsonl").read_bytes()
    assert len(read_jsonl(out / "eval" / "final.jsonl")) == 8  # toolfind's 4 and arith's own 4, each once
    assert summary["final_success"] == summary["baseline_success"]
    assert summary["rl_steps"] == 0
    ch = summary["heldout_change"]
    assert (ch["attempts"], ch["passed_change"], ch["passed_change_se"], ch["reward_change"]) == (8, 0.0, 0.0, 0.0)
