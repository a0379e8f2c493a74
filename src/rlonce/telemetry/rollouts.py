"""Every trained row of every step, stored compactly: RUN/rollouts/step-NNNN.npz + step-NNNN.json.

The ``.npz`` (numpy, deflate-compressed) holds the step's trained rows as flat columns —
``token_ids``, ``loss_mask``, ``rollout_logprobs``, ``advantages``, ``policy_versions``,
``candidates`` (-1 where no top-k/top-p cut was recorded), ``weights``, ``temperatures`` (one per
row: the temperature it was sampled at) — and ``row_offsets`` (row i is
``[row_offsets[i], row_offsets[i+1])``); a distilled source's ``teacher_logprobs`` (NaN where no
teacher scored) and with ``distill.topk`` = k ``teacher_topk_ids``/``teacher_topk_logprobs`` (N×k,
-1/NaN where none); and on the local trainer ``trainer_logprobs``: the
trainer's log-prob of each trained token when its gradient was taken (NaN elsewhere). The ``.json``
holds what the rows mean: the policy version the step trained (``train_version``), each source's
staleness bound, per row its group and the sequence it came from, and per group its task, source,
dispatch step and what the learning signal computed (``Sample.signal``: scores, pass flags, group
and final advantages) and each sequence's outcome with its grader's breakdown (status, reward, pass,
confirmed hack, failure and cause, the environment's metrics, the grader's transcript). A seeded
sample of the step's untrained sequences (``storage.untrained_fraction``: filtered, rejected, stale
or failed) is kept too — outcomes under ``untrained``, their contexts as ``untrained_*`` columns; on a
step that trained no row, every sequence is.
The token columns hold every context whole (prompts, tool calls and the sandbox's outputs included,
mask 0), so what the agent saw and ran is there. Both files are written to temporary names and
renamed, the ``.json`` last: a step is stored once its ``.json`` exists. ``rlonce audit`` reads
them. The Ray executor's rows are fetched from the object store and stored too
(``storage.remote_rows``; off, they are counted as ``rows_remote``, not stored).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from rlonce.core import faults
from rlonce.core.records import RecordError, Status, sequence_to_rows

FOLDER = "rollouts"


def _columns(rows, prefix: str = "") -> dict[str, np.ndarray]:
    lens = [len(r.token_ids) for r in rows]
    cols = {
        "token_ids": np.array([t for r in rows for t in r.token_ids], dtype=np.int32),
        "loss_mask": np.array([m for r in rows for m in r.loss_mask], dtype=np.uint8),
        "rollout_logprobs": np.array([x for r in rows for x in r.rollout_logprobs], dtype=np.float32),
        "advantages": np.array([x for r in rows for x in r.advantages], dtype=np.float32),
        "policy_versions": np.array([v for r in rows for v in r.policy_versions], dtype=np.int32),
        "candidates": np.array([c for r in rows for c in (r.candidates or [-1] * len(r.token_ids))], dtype=np.int32),
        "weights": np.array([r.weight for r in rows], dtype=np.float32),
        "temperatures": np.array([r.temperature for r in rows], dtype=np.float32),
        "row_offsets": np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(np.int64),
    }
    if any(r.teacher_logprobs is not None for r in rows):  # a distilled source's: NaN where no teacher scored
        cols["teacher_logprobs"] = np.array([x for r in rows for x in (r.teacher_logprobs or [np.nan] * len(r))],
                                            dtype=np.float32)
    top_k = max((len(t) for r in rows if r.teacher_topk for t in r.teacher_topk), default=0)
    if top_k:  # the teacher's top-k (distill.topk): per token k ids (-1) and log-probs (NaN) where none
        n = len(cols["token_ids"])
        ids, lps = np.full((n, top_k), -1, np.int32), np.full((n, top_k), np.nan, np.float32)
        at = 0
        for r in rows:
            for t, pairs in enumerate(r.teacher_topk or []):
                if pairs:
                    ids[at + t] = [tok for tok, _ in pairs]
                    lps[at + t] = [lp for _, lp in pairs]
            at += len(r)
        cols["teacher_topk_ids"], cols["teacher_topk_logprobs"] = ids, lps
    shapes = {r.routes.shape[1:] for r in rows if r.routes is not None}
    if len(shapes) == 1:  # a sparse policy's recorded experts (R3): per token layers x k ids, -1 where none
        routes = np.full((len(cols["token_ids"]), *shapes.pop()), -1, np.int16)
        at = 0
        for r in rows:
            if r.routes is not None:
                routes[at:at + len(r.routes)] = r.routes
            at += len(r)
        cols["routes"] = routes
    return {prefix + k: v for k, v in cols.items()}


def outcome(seq) -> dict:
    """A sequence's outcome and its grader's breakdown (finite numeric metrics, the model graders'
    ``Sequence.grades`` among them under their metric names), for the record."""
    metrics = {k: v for k, v in seq.metrics.items() if isinstance(v, (int, float)) and np.isfinite(v)}
    metrics.update(seq.grades.metrics())
    return {"task_id": seq.task_id, "arm": seq.arm, "status": seq.status.value, "reward": seq.reward,
            "passed": seq.passed, "hack_confirmed": seq.hack_confirmed, "turns": seq.turns,
            "failure": seq.failure.value if seq.failure else None, "cause": seq.cause, "metrics": metrics,
            "transcript": seq.transcript}


def write_step(run_dir: Path, step: int, rows, samples, *, train_version: int, staleness: dict[str, int],
               rows_remote: int = 0, untrained=(), trainer_logprobs: list | None = None) -> int:
    """Store step ``step``'s trained rows and groups, and the ``untrained`` sequences given (a
    sample of those the step did not train on: their contexts as rows with advantage 0, under
    ``untrained_*`` columns); returns the bytes written."""
    folder = run_dir / FOLDER
    folder.mkdir(exist_ok=True)
    spare = [(i, r) for i, q in enumerate(untrained) for r in _context_rows(q)]
    cols = {**_columns(rows), **_columns([r for _, r in spare], "untrained_")}
    if trainer_logprobs is not None and len(trainer_logprobs) == len(rows):
        cols["trainer_logprobs"] = _trainer_column(rows, trainer_logprobs)
    owners = _owners(rows, samples)
    meta = {"step": step, "train_version": train_version, "staleness": staleness, "rows_remote": rows_remote,
            "rows": [{"group_id": r.group_id, "sequence": owners[i]} for i, r in enumerate(rows)],
            "groups": [{"group_id": gid, "task_id": s.task_id, "source": s.source, "dispatch_step": s.dispatch_step,
                        "rewards": [q.reward for q in s.sequences if not q.infra_failed],
                        "sequences": [outcome(q) for q in s.sequences], **record}
                       for s in samples for gid, record in (s.signal or {None: {}}).items()],
            "untrained": [outcome(q) for q in untrained], "untrained_rows": [i for i, _ in spare]}
    npz, js = folder / f"step-{step:04d}.npz", folder / f"step-{step:04d}.json"
    tmp_npz, tmp_js = folder / f".tmp-step-{step:04d}.npz", folder / f".tmp-step-{step:04d}.json"
    with tmp_npz.open("wb") as f:
        np.savez_compressed(f, **cols)
    tmp_js.write_text(json.dumps(meta, separators=(",", ":")) + "\n")
    tmp_npz.replace(npz)
    faults.point("record.rollouts")
    tmp_js.replace(js)
    return npz.stat().st_size + js.stat().st_size


def _context_rows(seq) -> list:
    """``seq``'s contexts as rows for the record, advantage 0 — an infrastructure failure's too (stored
    to be looked at, never trained); a context too short to be a row is left out."""
    view = dataclasses.replace(seq, status=Status.SUBMITTED, failure=None) if seq.infra_failed else seq
    rows = []
    for ctx in seq.contexts:
        try:
            rows += sequence_to_rows(dataclasses.replace(view, contexts=[ctx]), 0.0)
        except RecordError:
            pass
    return rows


def _trainer_column(rows, logprobs) -> np.ndarray:
    """The trainer's log-prob of each trained token, aligned like ``rollout_logprobs`` (NaN where
    the loss mask is 0 or the trainer's were not seen here)."""
    out = []
    for r, lp in zip(rows, logprobs):
        col = np.full(len(r.token_ids), np.nan, dtype=np.float32)
        if lp is not None:
            col[1:] = lp.float().numpy()[: len(r.token_ids) - 1]
        col[np.asarray(r.loss_mask, dtype=bool) == 0] = np.nan
        out.append(col)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def _owners(rows, samples) -> list[int | None]:
    """Each row's sequence index within its group (the order ``Sample.signal['rows']`` gives)."""
    queue = {gid: list(rec.get("rows", [])) for s in samples for gid, rec in (s.signal or {}).items()}
    return [queue[r.group_id].pop(0) if queue.get(r.group_id) else None for r in rows]


def read_step(run_dir: Path, step: int) -> tuple[dict, dict[str, np.ndarray]]:
    folder = run_dir / FOLDER
    meta = json.loads((folder / f"step-{step:04d}.json").read_text())
    with np.load(folder / f"step-{step:04d}.npz") as z:
        return meta, {k: z[k] for k in z.files}


def stored_steps(run_dir: Path) -> list[int]:
    folder = run_dir / FOLDER
    return sorted(int(p.stem.split("-")[1]) for p in folder.glob("step-*.json")) if folder.is_dir() else []


def drop_after(run_dir: Path, step: int) -> None:
    """Remove the stored steps after ``step`` (a resumed run trains them again) and torn temporaries."""
    folder = run_dir / FOLDER
    for p in folder.glob("*step-*") if folder.is_dir() else []:
        if p.name.startswith(".tmp-") or int(p.stem.split("-")[-1]) > step:
            p.unlink(missing_ok=True)
