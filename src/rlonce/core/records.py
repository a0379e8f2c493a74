"""The records that carry a rollout from the sandbox to the optimizer.

The seed's four-level hierarchy, kept literally: a ``Sample`` (one dispatched task, a GRPO
group) holds G ``Sequence``s (one agent-loop execution each); a sequence holds ``Context``s
(dialogue branches); a context holds ``Segment``s (one turn each). Only model segments carry
loss, and each of their tokens keeps the log-probability it was sampled with, the policy
version that sampled it, the temperature it was sampled at and, under top-k/top-p, the size of
the candidate set it was drawn from (seed 000: recorded candidate sets renormalise the training
log-probs). ``TrainingRow`` is the flat form the trainer sees; its temperature is the one its
model segments share, so the trainer recomputes each row's log-probs at its own.

Invariants are checked when a record is built, so a broken record fails where it is made,
not three layers later inside a loss.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum

import numpy as np


class Role(str, Enum):
    PROMPT = "prompt"
    MODEL = "model"
    OBSERVATION = "observation"


class Status(str, Enum):
    """How a sequence ended. Only ``INFRA`` is not the model's doing."""

    SUBMITTED = "submitted"  # the agent submitted; the reward says whether it was right
    LIMITS = "limits"  # turn, token or context budget exhausted (truncated)
    FORMAT_ERROR = "format_error"  # unusable tool-call markup
    INFRA = "infra"  # the system failed; never scored, never trained on


class FailureCategory(str, Enum):
    SETUP_FAILED = "setup_failed"
    SANDBOX_TIMEOUT = "sandbox_timeout"
    SANDBOX_ERROR = "sandbox_error"
    ENGINE_ERROR = "engine_error"
    GRADER_UNAVAILABLE = "grader_unavailable"
    TESTBED_CORRUPTED = "testbed_corrupted"
    HARNESS_ERROR = "harness_error"
    WORKER_LOST = "worker_lost"
    """The process running the sequence died (a Ray actor lost mid-group)."""
    CALL_TIMEOUT = "call_timeout"
    """A remote call did not answer within its timeout."""
    TRAJECTORY_TIMEOUT = "trajectory_timeout"
    """The whole sequence outlived its wall-clock limit (``rlonce.core.timeouts``)."""
    SETUP_TIMEOUT = "setup_timeout"
    """Creating the environment outlived its limit."""
    REWARD_TIMEOUT = "reward_timeout"
    """Grading outlived its limit."""
    MODEL_TIMEOUT = "model_timeout"
    """One model request (an engine call through the gateway) outlived its limit."""
    AGENT_IDLE_TIMEOUT = "agent_idle_timeout"
    """The agent sent no model request for longer than its limit."""
    INTERNAL_ERROR = "internal_error"
    """A bug in rlonce (``rlonce.errors.is_internal``): counted apart from outages."""


class RecordError(ValueError):
    """A record violates one of its invariants."""


def _check_temperature(temperature: float, where: str) -> None:
    if not (math.isfinite(temperature) and temperature > 0):
        raise RecordError(f"a {where}'s temperature must be finite and > 0, got {temperature}")


def _check_candidates(candidates: list[int] | None, n: int, where: str) -> None:
    if candidates is None:
        return
    if len(candidates) != n:
        raise RecordError(f"{where} lengths differ: {n} tokens, {len(candidates)} candidate-set sizes")
    if any(k < 0 for k in candidates):
        raise RecordError("candidate-set sizes must be >= 0 (0: the whole vocabulary)")


TRANSCRIPT_CHARS = 4000
"""The longest grader transcript kept: enough for a test report's summary lines."""
ARTIFACT_CHARS = 16_000
"""The longest artifact kept (``Grade.artifact``)."""


@dataclass(frozen=True, slots=True)
class Grade:
    """A grader's verdict on one sequence: its reward and, explicitly, whether it solved the task.

    The two are separate because a reward can hold credit that is not a pass (the reasoning
    domain's format bonus, a partial score); ``passed`` is what success rates and the pass-gated
    steps of the learning signal read."""

    reward: float
    passed: bool
    transcript: str = ""
    """What the grader saw and decided, in words, for the record (``rlonce view``, stored rollouts):
    the answer against the expected one, the hidden tests' outcomes; at most ``TRANSCRIPT_CHARS``."""
    artifact: str = ""
    """What the attempt produced, for model graders to read (the code domain's diff); at most
    ``ARTIFACT_CHARS``. Empty: graders read the submitted answer."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "transcript", self.transcript[:TRANSCRIPT_CHARS])
        object.__setattr__(self, "artifact", self.artifact[:ARTIFACT_CHARS])
        if not math.isfinite(self.reward):
            raise RecordError(f"a grade's reward must be finite, got {self.reward}")


@dataclass(frozen=True, slots=True)
class Grades:
    """What the model graders (``rlonce.grading.graders``) concluded about one sequence, for the
    learning signal to read. None: no usable verdict, and the signal falls back (GRS keeps the
    test reward, GAR leaves the advantage unredistributed). Set by replacing the whole record."""

    rubric_solution: float | None = None
    """GRS: the share of the task's solution rubric items the judge found satisfied, in [0, 1]."""
    rubric_behavior: float | None = None
    """GRS: the share of its behaviour rubric items satisfied, in [0, 1]."""
    gar_quality: float | None = None
    """GAR: the quality factor f of a passing attempt, in [0, 1]."""
    gar_leaked: bool = False
    """GAR found the pass came through a leaked answer (the sequence's ``hack_confirmed`` says so too)."""
    audit_hack: bool = False
    """The hack audit confirmed a hack (likewise recorded as ``hack_confirmed``)."""

    def __post_init__(self) -> None:
        for name in ("rubric_solution", "rubric_behavior", "gar_quality"):
            x = getattr(self, name)
            if x is not None and not (math.isfinite(x) and 0.0 <= x <= 1.0):
                raise RecordError(f"a grade's {name} must be in [0, 1], got {x}")

    def metrics(self) -> dict[str, float]:
        """The grades that were given, under the names stored rollouts and the docs use
        (``grs_solution``, ``grs_behavior``, ``gar_quality``, ``gar_leaked``, ``audit_hack``)."""
        out = {"grs_solution": self.rubric_solution, "grs_behavior": self.rubric_behavior,
               "gar_quality": self.gar_quality}
        return {**{k: float(x) for k, x in out.items() if x is not None},
                **({"gar_leaked": 1.0} if self.gar_leaked else {}),
                **({"audit_hack": 1.0} if self.audit_hack else {})}

    @classmethod
    def from_metrics(cls, metrics: dict) -> Grades:
        """The grades a record written before ``Sequence.grades`` existed kept in its metrics."""
        return cls(metrics.get("grs_solution"), metrics.get("grs_behavior"), metrics.get("gar_quality"),
                   bool(metrics.get("gar_leaked")), bool(metrics.get("audit_hack")))


@dataclass(slots=True)
class Segment:
    """One turn. Model segments hold, per token, the rollout log-prob and policy version."""

    role: Role
    token_ids: list[int]
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    finish_reason: str | None = None
    flags: dict[str, bool] = field(default_factory=dict)
    candidates: list[int] | None = None
    """Model segments sampled under top-k/top-p: per token, the size k of its candidate set — the
    k tokens the sampling policy ranked highest (0: the whole vocabulary). None: no cut."""
    temperature: float = 1.0
    """Model segments: the temperature the tokens were sampled at (the rollout log-probs are of that
    distribution); the trainer divides the logits by it."""
    forced: bool = False
    """Model segments the policy did not sample: a distillation prefix's turns, replayed from a
    demonstration or a teacher's rollout (``rlonce.distill.prefixes``). Never trained."""
    teacher_logprobs: list[float] | None = None
    """Model segments of a distilled source: per token, its log-prob under the source's teacher at the
    segment's temperature (``rlonce.distill.teachers``), scored once after the sequence ended."""
    teacher_topk: list[list[tuple[int, float]]] | None = None
    """With ``distill.topk`` = k: per token, the teacher's k most likely tokens at its position as
    (token id, log-prob) pairs, scored with ``teacher_logprobs``."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if self.teacher_logprobs is not None and (self.role is not Role.MODEL or len(self.teacher_logprobs) != n
                                                  or not all(math.isfinite(x) for x in self.teacher_logprobs)):
            raise RecordError("teacher log-probs belong to a model segment: one finite value per token")
        if self.teacher_topk is not None:
            _check_topk(self.teacher_topk, n, self.teacher_logprobs is not None)
        if self.role is Role.MODEL:
            _check_temperature(self.temperature, "model segment")
            if self.logprobs is None or self.versions is None:
                raise RecordError("a model segment needs a rollout log-prob and a version per token")
            if len(self.logprobs) != n or len(self.versions) != n:
                raise RecordError(
                    f"model segment lengths differ: {n} tokens, {len(self.logprobs)} log-probs, "
                    f"{len(self.versions)} versions"
                )
            if any(v < 0 for v in self.versions):
                raise RecordError("policy versions must be >= 0")
            if any(not math.isfinite(lp) or lp > 1e-6 for lp in self.logprobs):
                raise RecordError("rollout log-probs must be finite and <= 0")
            _check_candidates(self.candidates, n, "model segment")
        elif self.logprobs is not None or self.versions is not None or self.candidates is not None:
            raise RecordError(f"a {self.role.value} segment is never trained on; it carries no log-probs")

    @property
    def trainable(self) -> bool:
        return self.role is Role.MODEL and not self.forced


@dataclass(slots=True)
class Context:
    """One dialogue branch: its segments in order. Its token list is their concatenation."""

    segments: list[Segment] = field(default_factory=list)
    label: str = "main"
    routes: np.ndarray | None = None
    """A sparse policy's routing replay (R3, ``rlonce.model.moe``): from the first token on, the
    experts each sparse layer sent each token to when the engine last ran it, an unsigned
    (positions, layers, k) array. It covers fewer positions than the context holds: the last
    sampled token was never run. None for a dense policy."""

    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    def __len__(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    def model_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.trainable)


@dataclass(slots=True)
class Sequence:
    """One agent-loop execution of a task under one harness arm."""

    task_id: str
    arm: str
    contexts: list[Context] = field(default_factory=list)
    status: Status = Status.SUBMITTED
    failure: FailureCategory | None = None
    reward: float | None = None
    answer: str | None = None
    turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    """Measurements: the environment's (``items_passed``, ``hack_suspected``, ``grade/<name>``), the
    gateway's and the runner's (tokens, seconds). What model graders conclude is in ``grades``."""
    hack_confirmed: bool = False
    """A grader confirmed this sequence obtained its reward by a hack; its reward becomes 0."""
    cause: str | None = None
    """For an infrastructure failure, the exception behind it (``Type: message``)."""
    passed: bool = False
    """The grader's verdict (``Grade.passed``): the task was solved. Evaluations, length shaping,
    GRS, GAR and hack zeroing read this flag, never a threshold on ``reward`` (a format bonus is
    reward without a pass)."""
    transcript: str = ""
    """The grader's account of its verdict (``Grade.transcript``)."""
    artifact: str = ""
    """What the attempt produced (``Grade.artifact``), for model graders."""
    grades: Grades = field(default_factory=Grades)
    """The model graders' outputs the learning signal reads (GRS rubric scores, GAR quality)."""

    def __post_init__(self) -> None:
        if (self.status is Status.INFRA) != (self.failure is not None):
            raise RecordError("a failure category is given exactly when the status is infra")

    @property
    def infra_failed(self) -> bool:
        return self.status is Status.INFRA

    def set_grade(self, grade: Grade | None) -> None:
        """Record the grader's verdict (None: no verdict, e.g. an infrastructure failure)."""
        self.reward, self.passed = (None, False) if grade is None else (grade.reward, grade.passed)
        self.transcript = "" if grade is None else grade.transcript
        self.artifact = "" if grade is None else grade.artifact


@dataclass(slots=True)
class Sample:
    """One dispatched task and its G sequences: a GRPO group."""

    task_id: str
    source: str
    dispatch_step: int
    sequences: list[Sequence] = field(default_factory=list)
    signal: dict = field(default_factory=dict)
    """What the learning signal computed for the group when it was trained (``rlonce.algo.signal``):
    per valid sequence its score, pass flag, group advantage and final advantage, and per row
    kept the index of the sequence it came from — what ``rlonce audit`` recomputes."""

    @property
    def group_id(self) -> str:
        """``source:task_id@dispatch_step``: two sources of one domain draw the same task ids, and
        their groups must never be one prompt to the signal (prompt-mean aggregation, mini-batches)."""
        return f"{self.source}:{self.task_id}@{self.dispatch_step}"


@dataclass(slots=True)
class TrainingRow:
    """The flat per-sequence record the trainer consumes; all per-token lists have equal length.

    ``rollout_logprobs`` and ``policy_versions`` are meaningful where ``loss_mask`` is 1; other
    positions hold 0.0 and -1.
    """

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantages: list[float]
    policy_versions: list[int]
    weight: float = 1.0
    group_id: str = ""
    flags: dict[str, list[bool]] = field(default_factory=dict)
    """Per penalty rule that a batch-level strategy reads (``adv_signed``), per token: flagged.
    Carried so the signed rebalance can run over the step's whole batch (``rlonce.algo.signal``)."""
    candidates: list[int] | None = None
    """Per token, the candidate-set size it was sampled from (``Segment.candidates``; 0: the whole
    vocabulary, as on untrained positions); the trainer renormalises over it. None: no cut anywhere."""
    temperature: float = 1.0
    """The temperature the row's model tokens were sampled at (``Segment.temperature``): the trainer
    recomputes the row's log-probs at it."""
    teacher_logprobs: list[float] | None = None
    """A distilled source's rows: per token, the teacher's log-prob of it where the loss mask is 1
    (``Segment.teacher_logprobs``), 0.0 elsewhere. None: no teacher."""
    teacher_topk: list[list[tuple[int, float]]] | None = None
    """With ``distill.topk`` = k: per token where the loss mask is 1, the teacher's k most likely
    tokens there as (token id, log-prob) pairs (``Segment.teacher_topk``); [] where no token was
    scored (a rollout correction that masks a token keeps its pairs)."""
    lr_scale: float = 1.0
    """The row's source's learning rate over ``rl.lr`` (``[[sources]] lr``): the trainer never puts
    rows of two scales in one mini-batch, and steps each at its scale."""
    routes: np.ndarray | None = None
    """A sparse policy's recorded experts at the row's first positions (``Context.routes``), which
    the trainer's forward replays; positions past its length route as the trainer's router says."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        lens = {len(self.loss_mask), len(self.rollout_logprobs), len(self.advantages), len(self.policy_versions),
                *([len(self.teacher_logprobs)] if self.teacher_logprobs is not None else [])}
        if lens != {n}:
            raise RecordError(f"training row lengths differ: {n} tokens vs per-token fields {sorted(lens)}")
        if any(len(f) != n for f in self.flags.values()):
            raise RecordError(f"training row flags must have one entry per token ({n})")
        if n < 2:
            raise RecordError("a training row needs at least two tokens")
        if self.loss_mask[0]:
            raise RecordError("the first token has no context to predict it from; it cannot carry loss")
        for m, lp, v in zip(self.loss_mask, self.rollout_logprobs, self.policy_versions):
            if m and (v < 0 or not math.isfinite(lp)):
                raise RecordError("every trained token needs a rollout log-prob and a policy version")
        _check_candidates(self.candidates, n, "training row")
        _check_temperature(self.temperature, "training row")
        if isinstance(self.lr_scale, bool) or not (math.isfinite(self.lr_scale) and self.lr_scale > 0):
            raise RecordError(f"a training row's lr_scale must be a finite number > 0, got {self.lr_scale!r}")
        _check_routes(self.routes, n, "training row")
        if self.teacher_topk is not None:
            if len(self.teacher_topk) != n:
                raise RecordError(f"a training row's teacher top-k has one entry per token ({n})")
            _check_topk([t for t, m in zip(self.teacher_topk, self.loss_mask) if m], sum(self.loss_mask),
                        self.teacher_logprobs is not None)

    def __len__(self) -> int:
        return len(self.token_ids)


def _check_routes(routes: np.ndarray | None, n: int, where: str) -> None:
    if routes is None:
        return
    if not isinstance(routes, np.ndarray) or routes.ndim != 3 or routes.dtype.kind != "u" or len(routes) > n:
        raise RecordError(f"a {where}'s routes are an unsigned (positions <= {n}, layers, k) array, got "
                          f"{getattr(routes, 'dtype', type(routes).__name__)} {getattr(routes, 'shape', '')}")


def _check_topk(topk: list, n: int, scored: bool) -> None:
    """Per token, k > 0 (token id, finite log-prob ≤ 0) pairs, the same k throughout, beside teacher log-probs."""
    if not scored or len(topk) != n:
        raise RecordError("a teacher's top-k comes with its log-probs: one list of (token, log-prob) pairs per token")
    ks = {len(t) for t in topk}
    if len(ks) > 1 or 0 in ks or any(
            not isinstance(tok, int) or tok < 0 or not math.isfinite(lp) or lp > 1e-6 for t in topk for tok, lp in t):
        raise RecordError("a teacher's top-k holds, per token, the same number k > 0 of (token id >= 0, finite "
                          "log-prob <= 0) pairs")


def _topk_from(data: list | None) -> list[list[tuple[int, float]]] | None:
    """``Segment.teacher_topk`` from its plain data (lists of [token, log-prob] pairs)."""
    return None if data is None else [[(int(tok), float(lp)) for tok, lp in t] for t in data]


def sequence_to_rows(seq: Sequence, advantage: float, *, group_id: str = "", weight: float = 1.0) -> list[TrainingRow]:
    """Flatten each context of ``seq`` into a row; ``advantage`` is broadcast to its model tokens.
    A row has one temperature: its model segments must share theirs."""
    if seq.infra_failed:
        raise RecordError(f"sequence of {seq.task_id} failed in the infrastructure; it is never trained on")
    rows = []
    for ctx in seq.contexts:
        ids: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        vers: list[int] = []
        cands: list[int] = []
        teacher: list[float] = []
        topk: list[list[tuple[int, float]]] = []
        for seg in ctx.segments:
            n = len(seg.token_ids)
            ids += seg.token_ids
            cands += seg.candidates or [0] * n
            if seg.trainable:
                mask += [1] * n
                lps += seg.logprobs  # type: ignore[arg-type]
                vers += seg.versions  # type: ignore[arg-type]
                teacher += seg.teacher_logprobs or [math.nan] * n
                topk += seg.teacher_topk or [None] * n
            else:
                mask += [0] * n
                lps += [0.0] * n
                vers += [-1] * n
                teacher += [0.0] * n
                topk += [[] for _ in range(n)]
        adv = [advantage if m else 0.0 for m in mask]
        temps = {seg.temperature for seg in ctx.segments if seg.trainable}
        if len(temps) > 1:
            raise RecordError(f"a context of {seq.task_id} was sampled at several temperatures {sorted(temps)}: "
                              "a training row has one")
        scored = any(s.teacher_logprobs is not None for s in ctx.segments if s.trainable)
        if scored and any(math.isnan(x) for x in teacher):
            raise RecordError(f"a context of {seq.task_id} has model turns the teacher scored and turns it did not")
        with_topk = any(s.teacher_topk is not None for s in ctx.segments if s.trainable)
        if with_topk and any(t is None for t in topk):
            raise RecordError(f"a context of {seq.task_id} has model turns with the teacher's top-k and turns without")
        rows.append(TrainingRow(ids, mask, lps, adv, vers, weight=weight, group_id=group_id,
                                candidates=cands if any(cands) else None, temperature=temps.pop() if temps else 1.0,
                                teacher_logprobs=teacher if scored else None, teacher_topk=topk if with_topk else None,
                                routes=None if ctx.routes is None else ctx.routes[:len(ids)]))
    return rows


def sequence_to_dict(seq: Sequence) -> dict:
    """Plain data (for checkpoints): every token, log-prob, version, candidate-set size, temperature and flag."""
    return {"task_id": seq.task_id, "arm": seq.arm, "status": seq.status.value,
            "failure": seq.failure.value if seq.failure else None, "reward": seq.reward, "answer": seq.answer,
            "turns": seq.turns, "passed": seq.passed, "metrics": dict(seq.metrics),
            "hack_confirmed": seq.hack_confirmed, "cause": seq.cause, "transcript": seq.transcript,
            "artifact": seq.artifact, "grades": asdict(seq.grades),
            "contexts": [{"label": c.label, "routes": c.routes, "segments": [
                {"role": s.role.value, "token_ids": list(s.token_ids), "logprobs": s.logprobs, "versions": s.versions,
                 "finish_reason": s.finish_reason, "flags": dict(s.flags), "candidates": s.candidates,
                 "temperature": s.temperature, "forced": s.forced, "teacher_logprobs": s.teacher_logprobs,
                 "teacher_topk": s.teacher_topk}
                for s in c.segments]} for c in seq.contexts]}


_GRADE_METRICS = ("grs_solution", "grs_behavior", "gar_quality", "gar_leaked", "audit_hack")


def sequence_from_dict(d: dict) -> Sequence:
    contexts = [Context([Segment(Role(s["role"]), s["token_ids"], s["logprobs"], s["versions"], s["finish_reason"],
                                 s["flags"], s.get("candidates"),
                                 s.get("temperature", 1.0),  # older checkpoints: harness.temperature's default
                                 s.get("forced", False), s.get("teacher_logprobs"),
                                 _topk_from(s.get("teacher_topk")))
                          for s in c["segments"]], c["label"], c.get("routes"))
                for c in d["contexts"]]
    metrics = dict(d["metrics"])
    # checkpoints written before Sequence.grades existed kept the grades among the metrics
    grades = Grades(**d["grades"]) if "grades" in d else Grades.from_metrics(
        {k: metrics.pop(k) for k in _GRADE_METRICS if k in metrics})
    return Sequence(d["task_id"], d["arm"], contexts, Status(d["status"]),
                    FailureCategory(d["failure"]) if d["failure"] else None, d["reward"], d["answer"], d["turns"],
                    metrics, d["hack_confirmed"], d.get("cause"), grades=grades,
                    # checkpoints written before the grader's flag existed: the rule they were made under
                    passed=d.get("passed", d["reward"] is not None and d["reward"] >= 1.0),
                    transcript=d.get("transcript", ""), artifact=d.get("artifact", ""))


def version_lags(rows: list[TrainingRow], version: int) -> Counter:
    """How many trained tokens lag the trainer's ``version`` by each number of versions."""
    return Counter(version - v for r in rows for v, m in zip(r.policy_versions, r.loss_mask) if m)


def staleness_violations(rows: list[TrainingRow], version: int, staleness: Callable[[str], int]) -> int:
    """Trained tokens older than their source allows: a source with staleness s trains tokens at
    most s − 1 versions behind the trainer's ``version``; ``staleness(group_id)`` is the s of the
    row's group's source."""
    return sum(1 for r in rows for v, m in zip(r.policy_versions, r.loss_mask)
               if m and version - v > staleness(r.group_id) - 1)
