"""Domains: what a job trains on — a task stream per split and the environment built around a task.

The GRPO job, the evaluator and ``rlonce tasks filter`` see a domain only through this record,
so a new domain is one ``Domain`` away from the whole loop. Splits: ``sft`` (demonstrations),
``train`` (RL), ``heldout`` (evaluation); each is an endless indexed stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rlonce.errors import PackError

SFT_TASK_OFFSET = 0
RL_TASK_OFFSET = 1_000_000


@dataclass
class Domain:
    name: str
    """Also the task source name in the mixer and the ledger."""
    env_factory: Callable
    make: Callable[[str, int], object]
    """(split, index) → task."""
    kept: list[int] | None = None
    """Train indices a difficulty filter kept; the train stream then cycles through them."""
    has_expert: bool = False

    def task(self, split: str, index: int):
        if split == "train" and self.kept is not None:
            return self.make("train", self.kept[index % len(self.kept)])
        return self.make(split, index)


def read_pack(path: str | Path) -> dict:
    f = Path(path) / "filter.json"
    if not f.is_file():
        raise PackError(f"{path} is not a filtered task pack (no filter.json); make one with "
                        "`rlonce tasks filter reasoning --out DIR`")
    pack = json.loads(f.read_text())
    if not pack.get("kept"):
        raise PackError(f"the pack {path} kept no task (every pass rate was 0 or >= {pack.get('max_pass')}); "
                        "filter more tasks or use an easier dataset")
    return pack


def _toolfind_task(two_hop: float, split: str, index: int):
    from rlonce.envs.toolfind.tasks import make_task

    if split == "heldout":
        return make_task("heldout", index, two_hop_fraction=two_hop)
    offset = SFT_TASK_OFFSET if split == "sft" else RL_TASK_OFFSET
    return make_task("train", offset + index, two_hop_fraction=two_hop)


def domain_for(task_cfg) -> Domain:
    """The domain a ``TaskConfig`` names."""
    if task_cfg.name == "toolfind":
        from rlonce.envs.toolfind.env import ToolfindEnv

        return Domain("toolfind", ToolfindEnv, partial(_toolfind_task, task_cfg.two_hop_fraction), has_expert=True)
    from rlonce.envs.reasoning.env import SYSTEM_PROMPT, ReasoningEnv
    from rlonce.envs.reasoning.tasks import make_task

    datasets, options = list(task_cfg.datasets), dict(task_cfg.options)
    kept = None
    if task_cfg.pack:
        pack = read_pack(task_cfg.pack)
        if pack["datasets"] != datasets or pack["options"] != options:
            raise PackError(f"the pack {task_cfg.pack} was filtered from datasets {pack['datasets']} with options "
                            f"{pack['options']}, not the configured {datasets} {options}; filter again or fix task.*")
        kept = list(pack["kept"])
    env = partial(ReasoningEnv, format_weight=task_cfg.format_weight,
                  system_prompt=task_cfg.system_prompt or SYSTEM_PROMPT)
    return Domain("reasoning", env, lambda split, i: make_task(split, i, datasets, options), kept=kept)
