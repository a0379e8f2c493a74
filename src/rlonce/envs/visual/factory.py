"""The visual domain's environment factory and its group hook (the open-ended family's grader).

``VisualFactory(task)`` builds a ``VisualEnv`` that saves its renders under the run's
``visual/`` folder. Its ``grade_group`` runs after every sibling of an open-ended task was
rendered: the pick judge (``pick.grade_group``: eight rounds, Williams ordering, query fit, runtime
gate) sets each sibling's reward. A sibling whose pick or query-fit result is missing becomes an
infrastructure failure (``grader_unavailable``, counted) — neither a 0 nor the group's mean.
Replication tasks have nothing to do here.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from rlonce.core.records import FailureCategory, Grade, Status
from rlonce.envs.base import GradingError, JudgeBinding
from rlonce.envs.visual import pick
from rlonce.envs.visual.env import SHOTS_HEADER, VisualEnv
from rlonce.envs.visual.tasks import VisualTask

PICK_ROUNDS = 8


def shot_of(artifact: str) -> bytes | None:
    """The desktop screenshot whose path the env wrote on the artifact's first line."""
    first = artifact.split("\n", 1)[0]
    if not first.startswith(SHOTS_HEADER):
        return None
    paths = first.removeprefix(SHOTS_HEADER).removesuffix(" -->").split()
    if not paths:
        return None
    return Path(sorted(paths)[0]).read_bytes()  # delay 0 sorts first


class VisualFactory:
    def __init__(self, *, shots_dir: Path | None = None, judge: JudgeBinding | None = None, seed: int = 0):
        self._shots_dir = Path(shots_dir) if shots_dir else None
        self.judge = judge
        self.seed = seed

    @property
    def shots_dir(self) -> Path:
        """Where renders are saved: the run's ``visual/`` folder, else a temporary one made on first use
        (open-ended grading reads the screenshots back)."""
        if self._shots_dir is None:
            self._shots_dir = Path(tempfile.mkdtemp(prefix="rlonce-visual-"))
        return self._shots_dir

    def __call__(self, task: VisualTask) -> VisualEnv:
        return VisualEnv(task, shots_dir=self.shots_dir if task.layout is None or self._shots_dir else None)

    async def grade_group(self, task: VisualTask, sequences: list) -> None:
        if task.layout is not None:
            return
        if self.judge is None:
            raise GradingError("open-ended visual tasks need a vision judge: set grading.judge (kind, base_url) "
                                    "and grading.judge.vision = true")
        shots = await asyncio.to_thread(lambda: [shot_of(s.artifact) for s in sequences])
        factors = [0.0 if s.metrics.get("grade/gated", 0.0) else 1.0 for s in sequences]
        result = await pick.grade_group(task.request.text, shots, factors, self.judge, rounds=PICK_ROUNDS,
                                        seed=self.seed)
        for s, r, pn, qf in zip(sequences, result.reward, result.pick_norm, result.query_fit):
            s.metrics.update({f"grade/{k}": v for k, v in result.metrics().items()})
            if r is None:
                s.status, s.failure = Status.INFRA, FailureCategory.GRADER_UNAVAILABLE
                s.cause = "the pick judge gave no pick or query-fit result for this attempt"
                s.set_grade(None)
                continue
            s.metrics.update({"grade/pick_norm": float(pn or 0.0), "grade/query_fit": float(qf or 0.0)})
            s.set_grade(Grade(r, passed=(qf or 0.0) >= 0.9, artifact=s.artifact,
                              transcript=f"pick_norm {pn}, query fit {qf}, reward {r:.4f}"))
