"""What ``rlonce view`` shows, read from a run directory: steps, groups, sequences and contexts.

Everything comes from what the run wrote (``rlonce.telemetry.rollouts`` for the rows and their
meaning, ``metrics.jsonl``, ``ledger.jsonl``, ``summary.json``) and is read when first asked for,
so the page opens at once on a long run. A context's tokens are decoded with the run's own
tokenizer (the latest checkpoint's; without one, token ids are shown) into one text piece per
token, so that colouring is per token; the context is split into its turns — the prompt,
sampled model turns (with the tool calls they make) and the observations in between — by which
tokens carry a policy version (only sampled tokens do).

Each group carries ``explain``: how its advantages were computed, in words, from what the step's
record holds for it (scores, rewards, group and final advantages) and the run's ``algo`` settings
— the baseline, the normalisation, dynamic filtering, what changed a reward into a score, what
changed an advantage after the group, the penalties. An untrained group's record does not say
why it was dropped; its explanation gives the step's ledger for its source instead.

Trainer log-probs are shown only where the run stored them (a ``trainer_logprobs`` column beside
``rollout_logprobs``); otherwise the page says they were not recorded. Nothing here writes to
the run.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from pathlib import Path

import numpy as np

from rlonce.errors import UsageError
from rlonce.telemetry.metrics import read_jsonl
from rlonce.telemetry.rollouts import read_step, stored_steps

STEP_METRICS = ("reward_mean", "success_rate", "retained_rows", "trained_tokens", "entropy", "mismatch_kl",
                "clipfrac", "stale_dropped", "step_seconds")
"""The metrics listed beside each step (those the run recorded)."""
PIECE_WINDOW = 6
"""Tokens decoded before a token to find its own text (enough for a multi-byte character)."""


def check_run(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"view: {run_dir} does not exist; pass the --out directory of a train or quickstart run")
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"view: {run_dir} is not a run directory (no config.json); pass the --out directory of a "
                         "train or quickstart run")
    return run_dir


def _finite(xs) -> list:
    """A float column as JSON values: NaN and infinities become null."""
    return [float(x) if math.isfinite(x) else None for x in np.asarray(xs, dtype=np.float64).tolist()]


def token_pieces(decode, ids: list[int]) -> list[str]:
    """Each token's own text: the text ``decode`` gives the tokens up to it minus the text up to
    the one before (over a short window), so the pieces join to the decoded context. A token that
    ends inside a multi-byte character gets "" and the character goes to the token completing it."""
    pieces: list[str] = []
    start, done = 0, ""
    for i in range(len(ids)):
        text = decode(ids[start:i + 1])
        if text.endswith("\ufffd") and i + 1 < len(ids):
            pieces.append("")
            continue
        pieces.append(text[len(done):] if text.startswith(done) else text)
        if i + 1 - start > PIECE_WINDOW:
            start = i + 1 - PIECE_WINDOW // 2
            done = decode(ids[start:i + 1])
        else:
            done = text
    return pieces


class Tokenizer:
    """The run's tokenizer and chat format, loaded once on first use (it imports transformers)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._loaded: tuple | None = None

    def folder(self) -> Path | None:
        for ck in sorted((self.run_dir / "checkpoints").glob("step-*"), reverse=True):
            if (ck / "tokenizer.json").is_file() and (ck / "config.json").is_file():
                return ck
        return None

    def get(self) -> tuple:
        """(decode, chat format or None, where it came from); decode is None without a tokenizer."""
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def _load(self) -> tuple:
        folder = self.folder()
        if folder is None:
            return None, None, "no checkpoint with tokenizer files: token ids are shown"
        from rlonce.model.chat import get_format
        from rlonce.model.loader import load

        lm = load(folder, weights=False)
        return lm.decode, get_format(lm.chat_format), f"{folder.name}/tokenizer.json"


def segments(versions: np.ndarray, pieces: list[str], fmt) -> list[dict]:
    """The context's turns in order: maximal runs of sampled tokens (a policy version >= 0) are
    model turns, the first other run is the prompt, later ones observations."""
    sampled = versions >= 0
    cuts = [0, *(np.flatnonzero(sampled[1:] != sampled[:-1]) + 1).tolist(), len(versions)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        if a == b:
            continue
        role = "model" if sampled[a] else ("prompt" if a == 0 else "observation")
        seg = {"role": role, "start": a, "end": b}
        if role == "model":
            seg.update(_tool_calls("".join(pieces[a:b]), fmt))
        out.append(seg)
    return out


def _tool_calls(text: str, fmt) -> dict:
    """The tool calls in a model turn's text, as the run's chat format parses them."""
    if fmt is None or not hasattr(fmt, "parse_tool_calls"):
        return {"tool_calls": [], "flag": None}
    body = text.removesuffix(fmt.turn_end)
    if "<tool_call>" not in body:
        return {"tool_calls": [], "flag": None}
    try:
        calls = fmt.parse_tool_calls(body)
    except ValueError:
        return {"tool_calls": [], "flag": "malformed tool call"}
    return {"tool_calls": [{"name": str(c.name), "arguments": json.dumps(c.arguments, ensure_ascii=False)}
                           for c in calls], "flag": None}


class RunView:
    """The run directory as the page's JSON: ``overview``, ``step``, ``context``, ``plot``."""

    def __init__(self, run_dir: Path):
        self.run_dir = check_run(run_dir)
        self.config = json.loads((self.run_dir / "config.json").read_text())
        self.tokenizer = Tokenizer(self.run_dir)
        self._plots: dict[int, bytes] = {}
        self._plot_lock = threading.Lock()

    def steps(self) -> list[int]:
        return stored_steps(self.run_dir)

    def _metrics(self) -> dict[int, dict]:
        return {r["step"]: r for r in read_jsonl(self.run_dir / "metrics.jsonl") if "reward_mean" in r}

    def overview(self) -> dict:
        metrics = self._metrics()
        path = self.run_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.is_file() else {}
        return {"run": self.run_dir.name, "summary": summary,
                "steps": [{"step": s, "metrics": {k: metrics.get(s, {}).get(k) for k in STEP_METRICS}}
                          for s in self.steps()],
                "plots": [{"id": i, "title": title} for i, (_, title, _) in enumerate(self._plot_specs())]}

    @functools.lru_cache(maxsize=8)  # noqa: B019 - one RunView per server, kept for its lifetime
    def _stored(self, step: int) -> tuple[dict, dict]:
        return read_step(self.run_dir, step)

    def stored(self, step: int) -> tuple[dict, dict] | None:
        return self._stored(step) if step in self.steps() else None

    def _source_of(self, task_id: str, staleness: dict) -> str | None:
        """An untrained sequence's source: the only one, or the source whose domain names the task."""
        if len(staleness) == 1:
            return next(iter(staleness))
        labels = {}
        for s in self.config.get("sources", []):
            labels.setdefault(s.get("name"), []).append(s.get("label") or s.get("name"))
        found = labels.get(task_id.split("/")[0], [])
        return found[0] if len(found) == 1 else None

    def step(self, step: int) -> dict | None:
        stored = self.stored(step)
        if stored is None:
            return None
        meta, cols = stored
        cols_of = (cols["row_offsets"], cols["loss_mask"], cols["policy_versions"])
        rows_of: dict[tuple, list[int]] = {}
        for i, r in enumerate(meta["rows"]):
            rows_of.setdefault((r["group_id"], r["sequence"]), []).append(i)
        algo = self.config.get("algo", {})
        groups = [{**_group(g, i, rows_of, *cols_of), "explain": explain_group(g, algo)}
                  for i, g in enumerate(meta["groups"])]
        ledger = [e for e in read_jsonl(self.run_dir / "ledger.jsonl") if e.get("step") == step]
        groups += self._untrained_groups(meta, cols, len(groups), ledger)
        return {"step": step, "train_version": meta["train_version"], "staleness": meta["staleness"],
                "rows_remote": meta.get("rows_remote", 0), "metrics": self._metrics().get(step, {}),
                "ledger": ledger, "trainer_logprobs": "trainer_logprobs" in cols, "groups": groups,
                "trained_nothing": not meta["rows"] and not meta.get("rows_remote", 0)}

    def _untrained_groups(self, meta: dict, cols: dict, first: int, ledger: list[dict]) -> list[dict]:
        off, mask = cols.get("untrained_row_offsets", np.zeros(1)), cols.get("untrained_loss_mask", np.zeros(0))
        versions = cols.get("untrained_policy_versions", np.zeros(0))
        rows_of: dict[int, list[int]] = {}
        for j, k in enumerate(meta.get("untrained_rows", [])):
            rows_of.setdefault(k, []).append(j)
        by_task: dict[str, list[dict]] = {}
        for k, o in enumerate(meta.get("untrained", [])):
            seq = {**o, "index": k, "kind": "untrained", "retained": False, "score": None, "advantage": None,
                   **_row_counts(rows_of.get(k, []), off, mask, versions)}
            by_task.setdefault(o["task_id"], []).append(seq)
        out = []
        for n, (task, seqs) in enumerate(by_task.items()):
            source = self._source_of(task, meta["staleness"])
            out.append({"index": first + n, "kind": "untrained", "group_id": None, "task_id": task, "source": source,
                        "dispatch_step": None, "retained": False, "scores": None, "advantages": None,
                        "group_advantages": None, "sequences": seqs,
                        "explain": explain_untrained(seqs, [e for e in ledger if source in (None, e.get("source"))])})
        return out

    def context(self, step: int, row: int, *, untrained: bool = False) -> dict | None:
        stored = self.stored(step)
        if stored is None:
            return None
        meta, cols = stored
        p = "untrained_" if untrained else ""
        if p + "row_offsets" not in cols or not 0 <= row < len(cols[p + "row_offsets"]) - 1:
            return None
        a, b = int(cols[p + "row_offsets"][row]), int(cols[p + "row_offsets"][row + 1])
        ids = cols[p + "token_ids"][a:b].tolist()
        versions = cols[p + "policy_versions"][a:b]
        decode, fmt, source = self.tokenizer.get()
        pieces = token_pieces(decode, ids) if decode else [f"⟨{t}⟩" for t in ids]
        sampled = versions >= 0
        rollout = np.where(sampled, cols[p + "rollout_logprobs"][a:b], np.nan)
        trainer = cols[p + "trainer_logprobs"][a:b] if p + "trainer_logprobs" in cols else None
        teacher = cols[p + "teacher_logprobs"][a:b] if p + "teacher_logprobs" in cols else None
        top = None
        if p + "teacher_topk_ids" in cols:  # distill.topk: per token the teacher's k most likely, [piece, log-prob]
            top = [None if t[0] < 0 else [[decode([int(i)]) if decode else f"⟨{i}⟩", float(x)] for i, x in zip(t, v)]
                   for t, v in zip(cols[p + "teacher_topk_ids"][a:b], cols[p + "teacher_topk_logprobs"][a:b])]
        routes = None
        if p + "routes" in cols:  # a sparse policy: per token, per layer, the experts it was routed to
            routes = [None if t[0][0] < 0 else t.tolist() for t in cols[p + "routes"][a:b]]
        outcome, owner = _owner(meta, row, untrained)
        mask = cols[p + "loss_mask"][a:b]
        return {"step": step, "row": row, "kind": "untrained" if untrained else "trained", **owner,
                "outcome": outcome, "train_version": meta["train_version"], "tokenizer": source,
                "tokens": len(ids), "model_tokens": int(sampled.sum()),
                "trained_tokens": 0 if untrained else int(mask.sum()), "weight": float(cols[p + "weights"][row]),
                "token_ids": ids, "pieces": pieces, "loss_mask": mask.astype(int).tolist(),
                "versions": versions.tolist(), "rollout_logprobs": _finite(rollout),
                "trainer_logprobs": None if trainer is None else _finite(trainer),
                "teacher_logprobs": None if teacher is None else _finite(np.where(mask > 0, teacher, np.nan)),
                "teacher_topk": top, "routes": routes,
                "advantages": _finite(cols[p + "advantages"][a:b]),
                "candidates": cols[p + "candidates"][a:b].tolist(), "segments": segments(versions, pieces, fmt)}

    def _plot_specs(self) -> list[tuple]:
        from rlonce.telemetry.report import PLOTS, moe_plots, source_plots

        rows = read_jsonl(self.run_dir / "metrics.jsonl")
        return PLOTS + source_plots(rows) + moe_plots(rows)

    def plot(self, plot_id: int) -> bytes | None:
        """The PNG of plot ``plot_id``, drawn by ``rlonce.telemetry.report`` (as in report.html)."""
        import base64

        from rlonce.telemetry.report import _plot, eval_task_counts

        specs = self._plot_specs()
        if not 0 <= plot_id < len(specs):
            return None
        with self._plot_lock:
            if plot_id not in self._plots:
                path = self.run_dir / "summary.json"
                baseline = json.loads(path.read_text()).get("baseline_success") if path.is_file() else None
                _, title, key = specs[plot_id]
                rows = read_jsonl(self.run_dir / "metrics.jsonl")
                counts = eval_task_counts(self.run_dir)
                self._plots[plot_id] = base64.b64decode(_plot(rows, key, title, baseline, counts))
            return self._plots[plot_id]


def _row_counts(rows: list[int], off: np.ndarray, mask: np.ndarray, versions: np.ndarray) -> dict:
    """A sequence's stored rows and their tokens: all, those the model sampled, those with loss mask 1."""
    spans = [(int(off[i]), int(off[i + 1])) for i in rows]
    return {"rows": rows, "tokens": sum(b - a for a, b in spans),
            "model_tokens": sum(int((versions[a:b] >= 0).sum()) for a, b in spans),
            "trained_tokens": sum(int(mask[a:b].sum()) for a, b in spans)}


def _group(g: dict, index: int, rows_of: dict, off: np.ndarray, mask: np.ndarray, versions: np.ndarray) -> dict:
    """A trained group and its sequences; ``rows`` index the step's columns. Scores and
    advantages are per scored sequence (infrastructure failures are never scored)."""
    seqs, k = [], 0
    for n, o in enumerate(g.get("sequences", [])):
        scored = o["status"] != "infra"
        rows = rows_of.get((g["group_id"], k), []) if scored else []
        seqs.append({**o, "index": n, "kind": "trained", "retained": bool(rows),
                     "score": _at(g, "scores", k) if scored else None,
                     "advantage": _at(g, "advantages", k) if scored else None,
                     **_row_counts(rows, off, mask, versions)})
        k += scored
    return {"index": index, "kind": "trained", "retained": True,
            **{key: g.get(key) for key in ("group_id", "task_id", "source", "dispatch_step", "scores", "advantages",
                                           "group_advantages")}, "sequences": seqs}


def _at(g: dict, key: str, k: int):
    xs = g.get(key)
    return xs[k] if xs is not None and k < len(xs) else None


def _owner(meta: dict, row: int, untrained: bool) -> tuple[dict | None, dict]:
    """The outcome of the sequence a row came from, and where it sits (group and sequence)."""
    if untrained:
        k = meta["untrained_rows"][row]
        return meta["untrained"][k], {"group_id": None, "sequence": k}
    r = meta["rows"][row]
    g = next((g for g in meta["groups"] if g["group_id"] == r["group_id"]), None)
    if g is None or r["sequence"] is None:
        return None, {"group_id": r["group_id"], "sequence": r["sequence"]}
    scored = [o for o in g.get("sequences", []) if o["status"] != "infra"]
    o = scored[r["sequence"]] if r["sequence"] < len(scored) else None
    return o, {"group_id": r["group_id"], "sequence": r["sequence"]}


def _num(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _close(xs, ys, tol: float = 1e-4) -> bool:
    return len(xs) == len(ys) and all(x is not None and y is not None and abs(x - y) <= tol for x, y in zip(xs, ys))


def explain_group(g: dict, algo: dict) -> list[list[str]]:
    """How a trained group's advantages came about, as ``[what, text]`` lines, from its stored
    record (``rlonce.telemetry.rollouts``: rewards, scores, group and final advantages, each
    sequence's outcome) and the run's ``algo`` settings. Sequences are numbered as the page
    numbers them (infrastructure failures included; they are never scored)."""
    scores, rewards = g.get("scores") or [], g.get("rewards") or []
    grouped, final = g.get("group_advantages") or [], g.get("advantages") or []
    seqs = g.get("sequences", [])
    shown = [n for n, o in enumerate(seqs) if o["status"] != "infra"]  # scored k -> page number
    infra = len(seqs) - len(shown)
    left = f"; {infra} infrastructure failure{'s' * (infra != 1)} left the group first, unscored" if infra else ""
    n = len(scores)
    lines = []
    if n > 1:
        mean = sum(scores) / n
        std = (sum((x - mean) ** 2 for x in scores) / (n - 1)) ** 0.5
        lines.append(["baseline", f"the mean of the group's {n} scores, {_num(mean)}{left}"])
        plain = _close(grouped, [x - mean for x in scores])
        normed = _close(grouped, [(x - mean) / (std + 1e-6) for x in scores])
        if normed and (algo.get("norm_by_std") or not plain):
            lines.append(["normalisation", f"(score − baseline) / the group's std {_num(std)} (algo.norm_by_std on)"])
        elif plain:
            lines.append(["normalisation", "none: advantage = score − baseline (algo.norm_by_std off)"])
        else:
            lines.append(["normalisation", "the stored advantages do not follow from the scores alone"])
    else:
        lines.append(["baseline", f"none: a lone score is its own advantage{left}"])
    if algo.get("filter_no_contrast", True):
        lines.append(["filtering", "kept: its scores differ (dynamic filtering drops a group whose scores are "
                                   "all equal)"])
    else:
        lines.append(["filtering", "off (algo.filter_no_contrast): kept whatever its scores"])
    changed = [f"#{shown[k]} {_num(r)} → {_num(x)} ({_reason(seqs[shown[k]], algo)})"
               for k, (r, x) in enumerate(zip(rewards, scores))
               if k < len(shown) and r is not None and abs(r - x) > 1e-9]
    lines.append(["reward → score", "; ".join(changed) if changed else "unchanged: each score is its reward"])
    moved = [f"#{shown[k]} {_num(a)} → {_num(b)}" for k, (a, b) in enumerate(zip(grouped, final))
             if k < len(shown) and abs(a - b) > 1e-9]
    if moved:
        lines.append(["after the group", "GAR moved advantages among passing sequences: " + "; ".join(moved)])
    lines.append(["penalties", _penalties(algo)])
    return lines


def _reason(o: dict, algo: dict) -> str:
    """Why a sequence's score differs from its reward (``rlonce.algo.signal`` steps 2–4)."""
    if o.get("hack_confirmed") and algo.get("zero_confirmed_hacks", True):
        return "confirmed hack zeroed"
    ways = [w for w, on in (("GRS rubric", algo.get("grs")), ("length shaping", (algo.get("length") or {}).get(
        "enabled"))) if on]
    return " or ".join(ways) if ways else "shaped"


def _penalties(algo: dict) -> str:
    specs = algo.get("penalties") or []
    acting = [f"{p['rule']} → {p['strategy']}" for p in specs if p.get("strategy") != "monitor"]
    watched = [p["rule"] for p in specs if p.get("strategy") == "monitor"]
    parts = [", ".join(acting) + " (flagged tokens' advantage or mask changed)"] if acting else []
    if watched:
        parts.append(f"{', '.join(watched)} counted only")
    if algo.get("mask_unfinished"):
        parts.append("a sequence cut by a budget without a pass gets no rows (algo.mask_unfinished)")
    return "; ".join(parts) if parts else "none configured"


def explain_untrained(seqs: list[dict], ledger: list[dict]) -> list[list[str]]:
    """An untrained group's lines: its record does not say why it was dropped, so the step's
    ledger for its source is given (the sequences' own status and failure are on their rows)."""
    infra = sum(q["status"] == "infra" for q in seqs)
    lines = [["not trained", "the record does not say why this group was dropped"
              + (f"; {infra} of its stored sequences failed in the infrastructure" if infra else "")]]
    for e in ledger:
        lines.append([f"ledger of {e.get('source')}",
                      f"filtered (no contrast) {e.get('no_contrast_filtered', 0)}, rejected by penalties "
                      f"{e.get('penalty_rejected', 0)}, unfinished {e.get('unfinished_dropped', 0)}, stale "
                      f"{e.get('stale_dropped', 0)}, infrastructure {e.get('infra_failed', 0)} sequences"])
    return lines
