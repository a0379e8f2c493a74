"""The run context: the loaded model and every part the job builds around it, built once.

``build_context`` is the one place a run's parts come into being from its resolved plans and its
model folder (a fresh run's model, a resumed run's checkpoint, or an evaluated model):

    model_dir ─► LoadedModel (with LoRA adapters where model.lora asks), chat format
    plans     ─► sources (domain + rollout spec per source, with its own sampling and budgets)
    cfg.algo  ─► learning-signal settings, entropy-bound controller (restored from ``bounds``)
    cfg.rl    ─► optimizer settings
    [grading] ─► model graders around the sources' executors

The job (``rlonce.recipes.grpo.Job``) holds one ``RunContext`` and never rebuilds a part of it;
the trainer backend and its engine start later, from the weights SFT leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlonce.algo.correction import EntropyBoundController
from rlonce.algo.signal import SignalSettings
from rlonce.config import ConfigError, RunConfig
from rlonce.dist.backends import check_backend
from rlonce.envs.domains import Domain
from rlonce.model import loader, moe
from rlonce.model.chat import ChatFormat, get_format
from rlonce.model.precision import wants_autocast
from rlonce.rollout.builders import bound_controller, rollout_spec, signal_settings
from rlonce.rollout.graded import Grading
from rlonce.rollout.sources import Source, SourcePlan, build_sources
from rlonce.train.builders import optim_settings
from rlonce.train.trainer import OptimSettings


@dataclass(frozen=True, kw_only=True)
class RunContext:
    lm: loader.LoadedModel
    fmt: ChatFormat
    model_dir: Path
    """The folder the weights were loaded from (engines load the tokenizer and config from it)."""
    sources: dict[str, Source]
    """Built sources by label, in the config's order."""
    signal: SignalSettings
    controller: EntropyBoundController | None
    """The entropy-driven four-bound controller, when ``algo`` configures one (it carries state)."""
    optim: OptimSettings
    grading: Grading | None
    """Model graders (``[grading]`` enabled), wrapped around each source's executor."""

    @property
    def domain(self) -> Domain:
        """The first source's domain: what one-domain tools (``rlonce tasks filter``, an outside
        harness's evaluation) work on."""
        return next(iter(self.sources.values())).domain


def check_sparse(cfg: RunConfig, model) -> None:
    """Refuse, before SFT, the settings that need a mixture-of-experts model on a dense one."""
    m = cfg.model
    asked = [k for k, on in (("model.freeze_router", m.freeze_router),
                             ("model.rollout_quant", m.rollout_quant != "none")) if on]
    if asked and model is not None and moe.shape(model) is None:
        verb = "needs" if len(asked) == 1 else "need"
        raise ConfigError(f"{' and '.join(asked)} {verb} a mixture-of-experts model, and {m.name!r} is dense: "
                          "unset them, or train a sparse model (model.name=embedded-moe; docs/moe.md)")


def build_context(cfg: RunConfig, plans: list[SourcePlan], model_dir: Path, out: Path, *,
                  bounds: dict | None = None) -> RunContext:
    """Load the model from ``model_dir`` and build the run's parts around it (``bounds``: a resumed
    run's entropy-bound controller state)."""
    lm = loader.load(model_dir, chat_format=cfg.model.chat_format, dtype=cfg.model.dtype,
                     lm_head_fp32=cfg.model.lm_head_fp32, autocast=wants_autocast(cfg.model.autocast),
                     packing=cfg.model.packing, share_prefix=cfg.model.share_prefix, lora_settings=cfg.model.lora)
    check_backend(cfg, model_dir)
    check_sparse(cfg, lm.model)
    sources = build_sources(plans, rollout_spec(cfg, lm), run_dir=out, grading=cfg.grading)
    controller = bound_controller(cfg.algo)
    if controller is not None and bounds:
        controller.load_state_dict(bounds)
    return RunContext(lm=lm, fmt=get_format(lm.chat_format), model_dir=model_dir, sources=sources,
                      signal=signal_settings(cfg.algo, plans, cfg.distill.clip), controller=controller,
                      optim=optim_settings(cfg.rl, cfg.model.freeze_router),
                      grading=Grading(cfg, sources, lm.decode, out) if cfg.grading.enabled else None)
