"""What ``rlonce view`` shows, read from a run directory: steps, groups, sequences and contexts.

Everything comes from what the run wrote (``rlonce.telemetry.rollouts`` for the rows and their
meaning, ``metrics.jsonl``, ``ledger.jsonl``, ``summary.json``) and is read when first asked for,
so the page opens at once on a long run. A context's tokens are decoded with the run's own
tokenizer (the latest checkpoint's; without one, token ids are shown) into one text piece per
token, so that colouring is per token; the context is split into its turns — the prompt,
sampled model turns (with the tool calls they make) and the observations in between — by which
tokens carry a policy version (only sampled tokens do).

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
        off, mask = cols["row_offsets"], cols["loss_mask"]
        rows_of: dict[tuple, list[int]] = {}
        for i, r in enumerate(meta["rows"]):
            rows_of.setdefault((r["group_id"], r["sequence"]), []).append(i)
        groups = [_group(g, i, rows_of, off, mask) for i, g in enumerate(meta["groups"])]
        groups += self._untrained_groups(meta, cols, len(groups))
        ledger = [e for e in read_jsonl(self.run_dir / "ledger.jsonl") if e.get("step") == step]
        return {"step": step, "train_version": meta["train_version"], "staleness": meta["staleness"],
                "rows_remote": meta.get("rows_remote", 0), "metrics": self._metrics().get(step, {}),
                "ledger": ledger, "trainer_logprobs": "trainer_logprobs" in cols, "groups": groups}

    def _untrained_groups(self, meta: dict, cols: dict, first: int) -> list[dict]:
        off, mask = cols.get("untrained_row_offsets", np.zeros(1)), cols.get("untrained_loss_mask", np.zeros(0))
        rows_of: dict[int, list[int]] = {}
        for j, k in enumerate(meta.get("untrained_rows", [])):
            rows_of.setdefault(k, []).append(j)
        by_task: dict[str, list[dict]] = {}
        for k, o in enumerate(meta.get("untrained", [])):
            seq = {**o, "index": k, "kind": "untrained", "retained": False, "score": None, "advantage": None,
                   **_row_counts(rows_of.get(k, []), off, mask)}
            by_task.setdefault(o["task_id"], []).append(seq)
        return [{"index": first + n, "kind": "untrained", "group_id": None, "task_id": task,
                 "source": self._source_of(task, meta["staleness"]), "dispatch_step": None, "retained": False,
                 "scores": None, "advantages": None, "group_advantages": None, "sequences": seqs}
                for n, (task, seqs) in enumerate(by_task.items())]

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
        outcome, owner = _owner(meta, row, untrained)
        mask = cols[p + "loss_mask"][a:b]
        return {"step": step, "row": row, "kind": "untrained" if untrained else "trained", **owner,
                "outcome": outcome, "train_version": meta["train_version"], "tokenizer": source,
                "tokens": len(ids), "trained_tokens": int(mask.sum()), "weight": float(cols[p + "weights"][row]),
                "token_ids": ids, "pieces": pieces, "loss_mask": mask.astype(int).tolist(),
                "versions": versions.tolist(), "rollout_logprobs": _finite(rollout),
                "trainer_logprobs": None if trainer is None else _finite(trainer),
                "advantages": _finite(cols[p + "advantages"][a:b]),
                "candidates": cols[p + "candidates"][a:b].tolist(), "segments": segments(versions, pieces, fmt)}

    def _plot_specs(self) -> list[tuple]:
        from rlonce.telemetry.report import PLOTS, source_plots

        return PLOTS + source_plots(read_jsonl(self.run_dir / "metrics.jsonl"))

    def plot(self, plot_id: int) -> bytes | None:
        """The PNG of plot ``plot_id``, drawn by ``rlonce.telemetry.report`` (as in report.html)."""
        import base64

        from rlonce.telemetry.report import _plot

        specs = self._plot_specs()
        if not 0 <= plot_id < len(specs):
            return None
        with self._plot_lock:
            if plot_id not in self._plots:
                path = self.run_dir / "summary.json"
                baseline = json.loads(path.read_text()).get("baseline_success") if path.is_file() else None
                _, title, key = specs[plot_id]
                rows = read_jsonl(self.run_dir / "metrics.jsonl")
                self._plots[plot_id] = base64.b64decode(_plot(rows, key, title, baseline))
            return self._plots[plot_id]


def _row_counts(rows: list[int], off: np.ndarray, mask: np.ndarray) -> dict:
    spans = [(int(off[i]), int(off[i + 1])) for i in rows]
    return {"rows": rows, "tokens": sum(b - a for a, b in spans),
            "trained_tokens": sum(int(mask[a:b].sum()) for a, b in spans)}


def _group(g: dict, index: int, rows_of: dict, off: np.ndarray, mask: np.ndarray) -> dict:
    """A trained group and its sequences; ``rows`` index the step's columns. Scores and
    advantages are per scored sequence (infrastructure failures are never scored)."""
    seqs, k = [], 0
    for n, o in enumerate(g.get("sequences", [])):
        scored = o["status"] != "infra"
        rows = rows_of.get((g["group_id"], k), []) if scored else []
        seqs.append({**o, "index": n, "kind": "trained", "retained": bool(rows),
                     "score": _at(g, "scores", k) if scored else None,
                     "advantage": _at(g, "advantages", k) if scored else None, **_row_counts(rows, off, mask)})
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
