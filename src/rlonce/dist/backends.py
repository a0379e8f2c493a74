"""The trainer backend a run's ``executor`` names: 'local' (``LocalBackend``: trainer and engine in
this process) or 'ray' (``RayCluster``: trainer, engine and harness-pool actors)."""

from __future__ import annotations

from pathlib import Path

from rlonce.dist.common import ray_module
from rlonce.engine.factory import EngineSpec
from rlonce.rollout.orchestrator import Judge
from rlonce.train.backend import LocalBackend, TrainerBackend
from rlonce.train.trainer import OptimSettings


def check_backend(cfg, model_dir: Path) -> None:
    """What ``build_backend`` will need, checked before the run spends minutes on SFT: Ray for
    executor 'ray', the engine's library (a missing one raises ``BackendMissing``)."""
    if cfg.executor == "ray":
        ray_module()
    EngineSpec.from_config(cfg, model_dir).check()


def build_backend(cfg, lm, model_dir: Path, run_dir: Path, *, version: int, optim: OptimSettings,
                  trainer_state: dict | None, judge: Judge, engine_factory=None,
                  say=lambda msg: None) -> TrainerBackend:
    """Start the run's trainer backend from ``lm``'s current weights at ``version`` and the saved
    optimizer state (None: a fresh optimizer); ``engine_factory(index)`` replaces the engines the
    config describes (a benchmark's simulated model); ``say`` tells the user what starts."""
    if cfg.executor == "ray":
        from rlonce.dist.cluster import RayCluster

        rc = cfg.ray
        say(f"starting Ray actors: {rc.trainer_workers} trainer(s), {rc.engines} engine(s), "
            f"{rc.harness_pools} harness pool(s)")
        return RayCluster(cfg, model_dir, run_dir, state=lm.model.state_dict(), version=version,
                          trainer_state=trainer_state, optim=optim, judge=judge, engine_factory=engine_factory)
    return LocalBackend(cfg, lm, model_dir, version=version, optim=optim, trainer_state=trainer_state,
                        engine_factory=engine_factory)
