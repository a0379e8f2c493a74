"""Teachers: the models whose per-token log-probs supervise a distilled source.

A teacher scores the student's sampled tokens once per sequence, after it ended: each context of
the sequence becomes a row (``sequence_to_rows``; prefix turns are not trained and not scored),
the rows run through the teacher in batches of about ``batch_tokens`` tokens with the trainer's
own log-prob code (``rlonce.train.trainer.score_tokens``: the row's temperature, its
candidate-set sizes), and each model segment gets ``Segment.teacher_logprobs`` — and with
``distill.topk`` = k, from the same forward, ``Segment.teacher_topk``: the teacher's k most likely
tokens at each position over the whole vocabulary. At identical
weights the teacher's log-probs are the trainer's, so the distillation advantage is 0 up to the
engine/trainer mismatch (``tests/unit/test_distill.py``).

A teacher is named like a model: 'embedded', 'smollm2', a model folder, a hub id in the local
cache — or a run directory, which means its latest checkpoint. It must share the student's
tokenizer: the tokens it scores are the student's. A teacher behind an HTTP endpoint is
``rlonce.distill.endpoint``; both are a ``Teacher``.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Protocol

from rlonce.config import ConfigError
from rlonce.core.records import RecordError, Sequence, sequence_to_rows
from rlonce.model import loader

Scored = tuple[list[float], list[list[tuple[int, float]]] | None]
"""One row as a teacher scored it: per token its log-prob (0.0 at position 0 and wherever the loss
mask is 0), and with top-k the (token id, log-prob) pairs of the k most likely tokens there ([]
where the loss mask is 0), else None."""


class Teacher(Protocol):
    """What scores a group: ``LocalTeacher``, ``EndpointTeacher``, ``RemoteTeacher`` (a Ray actor's)."""

    async def score(self, seqs: list[Sequence]) -> None:
        """Set ``teacher_logprobs`` on every trainable model segment of ``seqs``; an ``EngineError``
        when the teacher's infrastructure failed."""


def resolve(name: str, cache_dir: Path) -> Path:
    """The model folder teacher ``name`` names: a run directory's latest checkpoint, else what
    ``rlonce.model.loader.resolve`` makes of it."""
    from rlonce.train import checkpoint

    path = Path(name).expanduser()
    weights = any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))
    if path.is_dir() and (path / "checkpoints").is_dir() and not weights:  # a run directory (config.json: the run's)
        try:
            return checkpoint.latest(path)
        except checkpoint.NoCheckpoint as e:
            raise ConfigError(f"teacher {name}: {e}") from None
    return loader.resolve(name, cache_dir)


def check_tokenizer(teacher_lm, student_lm, name: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's (it would score other tokens)."""
    probe = "def f(x):\n    return x + 1  # tokenizers agree? 123 + 456 = 579 <|im_end|>"
    if teacher_lm.encode(probe) != student_lm.encode(probe) or teacher_lm.eos_token_ids != student_lm.eos_token_ids:
        raise ConfigError(f"teacher {name} has another tokenizer than the student: on-policy distillation scores "
                          "the student's own tokens, so both must share one (pick a teacher of the same family)")


class LocalTeacher:
    """A teacher model loaded in this process (read-only; forward passes on worker threads, one at a
    time, without gradient). A model it loads itself is frozen; one given as ``lm`` is used as it is
    (its owner may train it elsewhere)."""

    def __init__(self, name: str, path: Path, *, batch_tokens: int, dtype: str = "float32", lm=None, topk: int = 0):
        self.name, self.path, self.batch_tokens, self.topk = name, path, batch_tokens, topk
        self.lm = lm
        if lm is None:
            self.lm = loader.load(path, dtype=dtype)
            self.lm.model.eval()
            for p in self.lm.model.parameters():
                p.requires_grad_(False)
        self._lock = threading.Lock()

    def score_rows(self, rows) -> list[Scored]:
        """Per row, the teacher's log-prob of each of its tokens at the row's temperature and over its
        candidate sets, and with ``topk`` its k most likely tokens at each trained position."""
        import torch

        from rlonce.train.trainer import pad_rows, score_tokens

        out: list[Scored] = [([], None) for _ in rows]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        chunks, cur, width = [], [], 0
        for i in order:  # rows of similar length together, about batch_tokens padded tokens each
            width = max(width, len(rows[i]))
            if cur and width * (len(cur) + 1) > self.batch_tokens:
                chunks.append(cur)
                cur, width = [], len(rows[i])
            cur.append(i)
        if cur:
            chunks.append(cur)
        with self._lock, torch.no_grad():
            for idx in chunks:
                b = pad_rows([rows[i] for i in idx])
                sc = score_tokens(self.lm.model, b.ids_BT, b.attn_BT, b.temp_B, mask_BT=b.mask_BT, cand_BT=b.cand_BT,
                                  topk=self.topk)
                for j, i in enumerate(idx):
                    n, mask = len(rows[i]), rows[i].loss_mask[1:]
                    lps = [0.0] + [float(x) if m else 0.0 for x, m in zip(sc.lp_BT[j, : n - 1].tolist(), mask)]
                    top = None
                    if self.topk:
                        ids, lp = sc.top_ids_BTK[j, : n - 1].tolist(), sc.top_lp_BTK[j, : n - 1].tolist()
                        top = [[]] + [list(zip(a, c)) if m else [] for a, c, m in zip(ids, lp, mask)]
                    out[i] = (lps, top)
        return out

    async def score(self, seqs: list[Sequence]) -> None:
        """Set ``teacher_logprobs`` on every trainable model segment of ``seqs`` (infrastructure
        failures are never trained, so never scored)."""
        rows, where = scoring_rows(seqs)
        if rows:
            assign(where, await asyncio.to_thread(self.score_rows, rows))


def scoring_rows(seqs: list[Sequence]) -> tuple[list, list]:
    """The rows a teacher scores — one per context of ``seqs`` that holds a trainable model turn
    (infrastructure failures are never trained, so never scored) — and each row's context."""
    rows, where = [], []
    for s in seqs:
        if s.infra_failed:
            continue
        for ctx in s.contexts:
            if not any(seg.trainable for seg in ctx.segments):
                continue
            try:
                rows += sequence_to_rows(Sequence(s.task_id, s.arm, [ctx]), 0.0)
            except RecordError:  # a context too short to be a row carries no trained token
                continue
            where.append(ctx)
    return rows, where


def assign(where: list, scored: list[Scored]) -> None:
    """Each context's trainable model segments take their slice of its row's teacher log-probs (and
    top-k)."""
    for ctx, (lp, top) in zip(where, scored, strict=True):
        at = 0
        for seg in ctx.segments:
            n = len(seg.token_ids)
            if seg.trainable:
                seg.teacher_logprobs = lp[at: at + n]
                seg.teacher_topk = None if top is None else top[at: at + n]
            at += n
