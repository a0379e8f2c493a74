"""Experiment trackers: every record the run writes to ``metrics.jsonl`` also goes to TensorBoard
(event files under RUN/tensorboard, always unless ``tracker.tensorboard = false``) and, when
``tracker.wandb_project`` is set, to Weights & Biases (offline by default: files under RUN/wandb
for ``wandb sync``; online streams them). Both get the same numbers under the same names: a
record's numeric fields, nested dicts flattened with ``/`` (``src/toolfind/success``), at the
record's ``step``. A resumed run starts each tracker past its checkpoint's step, so a step the
crash cut short and the rerun wrote again is not shown twice (TensorBoard's ``purge_step``;
W&B resumes the same run id). The W&B key comes from the environment and is never written to
the run directory.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from rlonce.errors import UsageError


def scalars(record: dict, prefix: str = "") -> dict[str, float]:
    """A metrics record's numbers, nested dicts flattened with ``/``; ``step`` and non-numbers left out."""
    out: dict[str, float] = {}
    for k, v in record.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(scalars(v, name + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and name != "step" and math.isfinite(v):
            out[name] = float(v)
    return out


class TensorBoard:
    def __init__(self, run_dir: Path, resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"),
                                    purge_step=None if resume_step is None else resume_step + 1)

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, run_dir: Path, cfg, config: dict):
        try:
            import wandb
        except ImportError:
            raise UsageError("tracker.wandb_project needs Weights & Biases: pip install 'rlonce[wandb]' "
                             "(or unset tracker.wandb_project)") from None
        t = cfg.tracker
        run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]  # one W&B run per run directory
        self.wandb = wandb
        self.run = wandb.init(project=t.wandb_project, entity=t.wandb_entity, mode=t.wandb_mode, dir=str(run_dir),
                              id=run_id, resume="allow", name=run_dir.name, config=config,
                              settings=wandb.Settings(console="off", x_disable_stats=True))

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)  # a step W&B already holds (logged before a crash) it keeps once

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The run's trackers; ``log`` takes a ``metrics.jsonl`` record."""

    def __init__(self, cfg, run_dir: Path, config: dict, resume_step: int | None = None):
        self.active: list = []
        if cfg.tracker.tensorboard:
            self.active.append(TensorBoard(run_dir, resume_step))
        if cfg.tracker.wandb_project:
            self.active.append(WandB(run_dir, cfg, config))

    def log(self, record: dict) -> None:
        values = scalars(record)
        if values:
            for t in self.active:
                t.log(int(record.get("step", 0)), values)

    def close(self) -> None:
        for t in self.active:
            t.close()


class TrackedMetrics:
    """``metrics.jsonl`` (a ``JsonlWriter``) and the trackers, written together."""

    def __init__(self, jsonl, trackers: Trackers):
        self.jsonl, self.trackers = jsonl, trackers

    def write(self, record: dict) -> None:
        self.jsonl.write(record)
        self.trackers.log(record)

    def close(self) -> None:
        self.jsonl.close()
        self.trackers.close()
