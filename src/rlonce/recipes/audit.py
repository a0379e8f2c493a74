"""``rlonce audit RUN``: check a finished or interrupted run offline, and say what is wrong.

Each check reads what the run wrote — ``rollouts/`` (every trained row, ``rlonce.telemetry.rollouts``),
``ledger.jsonl``, ``metrics.jsonl``, ``provenance.json``, the checkpoints — and gives a verdict:

- **tokens**: every trained token has a finite rollout log-prob ≤ 0 and a policy version no newer
  than the one trained and at most its source's staleness − 1 older.
- **dispatch age**: every trained group was dispatched within its source's staleness.
- **ledger balance**: each step's entry per source balances (``LedgerEntry.check``).
- **ledger chain**: what a step carries over is what the next carries in, per source.
- **retained**: each step's stored groups hold as many sequences as its ledger retained.
- **no group twice**: no group was trained in two steps.
- **trained**: the RL steps retained at least one sequence (a run that trained on zero tokens fails).
- **advantages**: recomputed from the stored scores with the run's rule (group mean, ``norm_by_std``)
  they equal the stored group advantages, and every trained token of a row carries its sequence's
  final advantage — plus, in a distilled source, kl_weight · (teacher − rollout log-prob) from the
  stored teacher log-probs — (unless a penalty strategy reshaped tokens, which is then said).
- **checkpoints**: every checkpoint was written under the run's config and code (or a resume's,
  as ``provenance.json`` records).
- **mismatch**: steps whose train/inference KL stands far above the run's median are listed.
- **rft**: RFT's count of every attempt balances per source (passed or failed or an infrastructure
  failure; each pass kept or left out for a reason), and the kept attempts on record
  (``rft/step-0000.jsonl``) are as many, each submitted and rewarded.

The exit status is 1 when any check fails.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlonce.core.ledger import LedgerEntry, LedgerImbalance
from rlonce.errors import UsageError
from rlonce.telemetry.metrics import read_jsonl
from rlonce.telemetry.rollouts import read_step, stored_steps
from rlonce.telemetry.step import why_untrained

MISMATCH_OUTLIER = 10.0
"""A step's mismatch KL above this many times the run's median is listed."""
SHOWN = 3
"""Violations quoted per check."""


@dataclass
class Verdict:
    name: str
    checked: int = 0
    violations: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        head = f"[{'ok  ' if self.ok else 'FAIL'}] {self.name:<16} {self.checked} checked"
        tail = ""
        if self.violations:
            tail = f"; {len(self.violations)} violation(s): " + "; ".join(self.violations[:SHOWN])
        more = f" (+{len(self.violations) - SHOWN} more)" if len(self.violations) > SHOWN else ""
        return head + tail + more + (f"  [{self.note}]" if self.note else "")


def audit(run_dir: Path) -> list[Verdict]:
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.json); pass the --out of a run")
    try:
        config = json.loads((run_dir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{run_dir / 'config.json'} cannot be read as JSON ({type(e).__name__}: {e}); "
                         "a run writes it at its start: pass the --out of a run, or restore the file") from None
    if not isinstance(config, dict):
        raise UsageError(f"{run_dir / 'config.json'} is not a JSON object; pass the --out of a run")
    steps = stored_steps(run_dir)
    stored = {s: read_step(run_dir, s) for s in steps}
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    tokens = check_tokens(stored)
    size = sum(p.stat().st_size for p in (run_dir / "rollouts").glob("step-*")) if steps else 0
    if tokens.checked:  # what complete storage costs
        tokens.note = "; ".join(filter(None, [f"storage {size / 1e6:.2f} MB, {size / tokens.checked:.1f} B per "
                                              "trained token", tokens.note]))
    return [tokens, check_trained(ledger), check_dispatch_age(stored), check_ledger_balance(ledger),
            check_ledger_chain(ledger), check_retained(stored, ledger), check_groups_once(stored),
            check_advantages(stored, config), check_checkpoints(run_dir), check_mismatch(run_dir), check_rft(run_dir)]


def check_tokens(stored: dict) -> Verdict:
    v = Verdict("tokens")
    for step, (meta, cols) in stored.items():
        off, mask = cols["row_offsets"], cols["loss_mask"].astype(bool)
        lp, ver = cols["rollout_logprobs"], cols["policy_versions"]
        top = meta["train_version"]
        for i, row in enumerate(meta["rows"]):
            a, b = int(off[i]), int(off[i + 1])
            m = mask[a:b]
            stale = meta["staleness"].get(_source(meta, row["group_id"]), 1)
            lps, vs = lp[a:b][m], ver[a:b][m]
            v.checked += int(m.sum())
            bad_lp = ~np.isfinite(lps) | (lps > 1e-6)
            bad_v = (vs < 0) | (vs > top) | (top - vs > stale - 1)
            for kind, bad in (("log-prob", bad_lp), ("version", bad_v)):
                if bad.any():
                    j = int(np.flatnonzero(bad)[0])
                    what = (f"{float(lps[j])}" if kind == "log-prob"
                            else f"{int(vs[j])} (trained {top}, staleness {stale})")
                    v.violations.append(f"step {step} row {i} ({row['group_id']}): {int(bad.sum())} trained token(s) "
                                        f"with a bad {kind}, first {what}")
        if meta.get("rows_remote"):
            v.note = "rows an executor kept remote are not stored"
    return v


def check_trained(ledger: list[dict]) -> Verdict:
    """A run whose RL steps retained no sequence trained nothing: that is a failure, however clean
    its records are (every other check passes vacuously on zero tokens)."""
    steps = sorted({row["step"] for row in ledger})
    v = Verdict("trained", checked=len(steps))
    retained = sum(row.get("retained", 0) for row in ledger)
    if steps and not retained:
        total: dict[str, int] = {}
        for row in ledger:
            for k, n in row.items():
                if isinstance(n, int) and k != "step":
                    total[k] = total.get(k, 0) + n
        v.violations.append(f"the run trained on 0 tokens in {len(steps)} RL step(s): of {total.get('dispatched', 0)} "
                            f"dispatched, {why_untrained(total)}")
    elif not steps:
        v.note = "no RL step"
    return v


def check_rft(run_dir: Path) -> Verdict:
    """RFT's ledger (``rft.json``, ``rlonce.recipes.rft.select``) balances, and what it kept is on record."""
    v = Verdict("rft")
    path = run_dir / "rft.json"
    if not path.is_file():
        v.note = "no RFT"
        return v
    counts = json.loads(path.read_text())
    v.checked = len(counts)
    for label, c in counts.items():
        failed = c["attempts"] - c["infra_failed"] - c["passed"]
        left = c["duplicates"] + c["over_keep"] + c["suspected"]
        if failed < 0 or c["kept"] + left != c["passed"] or c["tasks_passed"] > min(c["kept"], c["tasks"]):
            v.violations.append(f"source {label}: {c['attempts']} attempts = {c['infra_failed']} infrastructure "
                                f"+ {c['passed']} passed + {failed} failed, and {c['passed']} passed = {c['kept']} "
                                f"kept + {left} left out: the counts do not balance")
    rows = read_jsonl(run_dir / "rft" / "step-0000.jsonl")
    kept = sum(c["kept"] for c in counts.values())
    if len(rows) != kept:
        v.violations.append(f"rft.json kept {kept} attempts but rft/step-0000.jsonl holds {len(rows)}")
    bad = [r["task_id"] for r in rows if r.get("status") != "submitted" or not (r.get("reward") or 0) > 0]
    if bad:
        v.violations.append(f"kept attempts that did not pass: {', '.join(bad[:SHOWN])}")
    return v


def _source(meta: dict, group_id: str) -> str:
    return next((g["source"] for g in meta["groups"] if g["group_id"] == group_id), "")


def check_dispatch_age(stored: dict) -> Verdict:
    v = Verdict("dispatch age")
    for step, (meta, _) in stored.items():
        for g in meta["groups"]:
            v.checked += 1
            stale = meta["staleness"].get(g["source"], 1)
            if step - g["dispatch_step"] + 1 > stale:
                v.violations.append(f"step {step}: {g['group_id']} dispatched at step {g['dispatch_step']}, "
                                    f"past {g['source']}'s staleness {stale}")
    return v


def check_ledger_balance(ledger: list[dict]) -> Verdict:
    v = Verdict("ledger balance", checked=len(ledger))
    for e in ledger:
        try:
            LedgerEntry(**e).check()
        except (LedgerImbalance, TypeError) as err:
            v.violations.append(str(err))
    return v


def check_ledger_chain(ledger: list[dict]) -> Verdict:
    v = Verdict("ledger chain")
    by_source = defaultdict(list)
    for e in ledger:
        by_source[e["source"]].append(e)
    for source, entries in by_source.items():
        entries.sort(key=lambda e: e["step"])
        for a, b in zip(entries, entries[1:]):
            v.checked += 1
            if b["step"] != a["step"] + 1:
                v.violations.append(f"{source}: step {a['step']} is followed by step {b['step']}")
            elif a["carried_over"] != b["carried_in"]:
                v.violations.append(f"{source}: step {a['step']} carried over {a['carried_over']}, step {b['step']} "
                                    f"carried in {b['carried_in']}")
    return v


def check_retained(stored: dict, ledger: list[dict]) -> Verdict:
    v = Verdict("retained")
    booked = {(e["step"], e["source"]): e["retained"] for e in ledger}
    for step, (meta, _) in stored.items():
        if meta.get("rows_remote"):
            continue
        held = Counter()
        for g in meta["groups"]:
            held[g["source"]] += len(g.get("scores", []))
        for source in set(held) | {s for (t, s) in booked if t == step}:
            v.checked += 1
            if held[source] != booked.get((step, source), 0):
                v.violations.append(f"step {step} {source}: {held[source]} sequences stored, ledger retained "
                                    f"{booked.get((step, source), 0)}")
    return v


def check_groups_once(stored: dict) -> Verdict:
    v = Verdict("no group twice")
    seen: dict[str, int] = {}
    for step, (meta, _) in sorted(stored.items()):
        for g in meta["groups"]:
            v.checked += 1
            if g["group_id"] in seen:
                v.violations.append(f"{g['group_id']} trained at steps {seen[g['group_id']]} and {step}")
            seen.setdefault(g["group_id"], step)
    return v


def check_advantages(stored: dict, config: dict) -> Verdict:
    import torch

    from rlonce.algo.advantages import group_advantages

    algo = config.get("algo", {})
    v = Verdict("advantages")
    reshaped = any(p.get("strategy") not in (None, "monitor") for p in algo.get("penalties", []))
    if reshaped:
        v.note = "a penalty strategy reshapes token advantages: rows checked against their sequence only in sign"
    for step, (meta, cols) in stored.items():
        groups = {g["group_id"]: g for g in meta["groups"]}
        for g in groups.values():
            if "scores" not in g:
                continue
            v.checked += 1
            want = group_advantages(torch.tensor(g["scores"]), [g["group_id"]] * len(g["scores"]),
                                    norm_by_std=algo.get("norm_by_std", False)).tolist()
            if not all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) for a, b in zip(want, g["group_advantages"])):
                v.violations.append(f"step {step} {g['group_id']}: stored advantages {_fmt(g['group_advantages'])} "
                                    f"!= recomputed {_fmt(want)}")
        off, mask, adv = cols["row_offsets"], cols["loss_mask"].astype(bool), cols["advantages"]
        for i, row in enumerate(meta["rows"]):
            g, k = groups.get(row["group_id"]), row["sequence"]
            if g is None or k is None or "advantages" not in g:
                continue
            span = slice(int(off[i]), int(off[i + 1]))
            a = adv[span][mask[span]]
            want = g["advantages"][k]
            if "distill" in g:  # each token's advantage also carries kl_weight · (teacher − rollout log-prob)
                if "teacher_logprobs" not in cols:
                    v.violations.append(f"step {step} row {i}: a distilled group's row is stored without teacher "
                                        "log-probs")
                    continue
                kl_w, clip = g["distill"]["kl_weight"], g["distill"].get("clip")
                d = (cols["teacher_logprobs"][span][mask[span]].astype(np.float64)
                     - cols["rollout_logprobs"][span][mask[span]].astype(np.float64))
                want = want + kl_w * (d if clip is None else np.clip(d, -clip, clip))
            bad = (np.sign(a) != np.sign(want)) if reshaped else ~np.isclose(a, want, rtol=1e-4, atol=1e-5)
            v.checked += 1
            if bad.any():
                first = float(np.broadcast_to(want, a.shape)[bad][0])
                v.violations.append(f"step {step} row {i} ({row['group_id']} sequence {k}): {int(bad.sum())} trained "
                                    f"token(s) with advantage {float(a[bad][0]):.4g}, the sequence's is {first:.4g}")
    return v


def _fmt(xs) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in xs) + "]"


def check_checkpoints(run_dir: Path) -> Verdict:
    v = Verdict("checkpoints")
    path = run_dir / "provenance.json"
    if not path.is_file():
        v.note = "no provenance.json (a run from before provenance was recorded)"
        return v
    prov = json.loads(path.read_text())
    configs = {prov.get("config_sha256")} | {r.get("config_sha256") for r in prov.get("resumes", [])}
    codes = {prov.get("code", {}).get("source_sha256")} | {r.get("code", {}).get("source_sha256")
                                                           for r in prov.get("resumes", [])}
    for ck in sorted((run_dir / "checkpoints").glob("step-*")):
        meta = ck / "provenance.json"
        v.checked += 1
        if not meta.is_file():
            v.violations.append(f"{ck.name}: no provenance.json")
            continue
        m = json.loads(meta.read_text())
        if m.get("config_sha256") not in configs:
            v.violations.append(f"{ck.name}: written under config {str(m.get('config_sha256'))[:12]}, not the run's")
        if m.get("code_sha256") not in codes:
            v.violations.append(f"{ck.name}: written by code {str(m.get('code_sha256'))[:12]}, not the run's")
    return v


def check_mismatch(run_dir: Path) -> Verdict:
    v = Verdict("mismatch")
    kl = [(r["step"], r["mismatch_kl"]) for r in read_jsonl(run_dir / "metrics.jsonl") if "mismatch_kl" in r]
    v.checked = len(kl)
    if kl:
        med = float(np.median([x for _, x in kl]))
        out = [f"step {s} KL {x:.3g}" for s, x in kl if med > 0 and x > MISMATCH_OUTLIER * med]
        v.note = f"median KL {med:.3g}" + (f"; outliers (> {MISMATCH_OUTLIER:g}x): {', '.join(out)}" if out else "")
    return v


def report(verdicts: list[Verdict]) -> tuple[str, int]:
    failed = [x for x in verdicts if not x.ok]
    tail = f"{len(failed)} check(s) failed" if failed else "every check passed"
    return "\n".join([x.line() for x in verdicts] + [tail]), 1 if failed else 0
