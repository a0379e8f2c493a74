"""Rule-verified reasoning tasks from ``reasoning-gym`` generators (MiniMax-M1 §4.1).

A task is data: the generator's entry (question, gold answer, metadata) frozen as JSON, so it
can travel between processes and be scored again by the generator's own scorer without the
generator. Generators are procedural: item ``i`` of a dataset depends only on its seed and
``i``, so an index stream is an endless, reproducible task stream. Splits use disjoint seeds
(train, held-out, SFT); ``task_id`` names dataset, split and index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from rlonce.errors import RlonceError

SPLIT_SEEDS = {"train": 1_001, "heldout": 2_002, "sft": 3_003}
STREAM = 10**9
"""Nominal dataset size: generators index by seed + position, the size only bounds positions."""


class TaskSpecError(RlonceError, ValueError):
    """A reasoning-gym dataset name or option is unusable."""


@dataclass(frozen=True)
class ReasoningTask:
    task_id: str
    source: str
    dataset: str
    question: str
    answer: str
    entry_json: str
    """The generator's entry (question, answer, metadata) as JSON: what its scorer reads."""
    options_json: str = "{}"
    """The dataset options it was generated with (to rebuild the scorer)."""

    @property
    def entry(self) -> dict:
        return json.loads(self.entry_json)


@lru_cache(maxsize=64)
def _dataset(name: str, seed: int, options_json: str):
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise TaskSpecError(f"unknown reasoning-gym dataset {name!r}; e.g. chain_sum, basic_arithmetic, products, "
                            f"leg_counting, countdown, gsm_symbolic, knights_knaves (all: {len(DATASETS)} in "
                            "reasoning_gym.factory.DATASETS)")
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=STREAM, **json.loads(options_json))
    except (TypeError, ValueError, AssertionError) as e:
        raise TaskSpecError(f"reasoning-gym dataset {name!r} rejects options {options_json}: {e}") from None


def scorer(task: ReasoningTask):
    """The generator's own ``score_answer(answer, entry)``."""
    return _dataset(task.dataset, SPLIT_SEEDS["train"], task.options_json).score_answer


def make_task(split: str, index: int, datasets: list[str], options: dict[str, dict] | None = None) -> ReasoningTask:
    """Item ``index`` of ``split``: datasets take turns (index mod n), each walking its own stream."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; known: {sorted(SPLIT_SEEDS)}")
    if not datasets:
        raise TaskSpecError("task.datasets is empty; name at least one reasoning-gym dataset")
    name = datasets[index % len(datasets)]
    opts = json.dumps((options or {}).get(name, {}), sort_keys=True)
    entry = _dataset(name, SPLIT_SEEDS[split], opts)[index // len(datasets)]
    entry = {"question": entry["question"], "answer": str(entry["answer"]), "metadata": entry.get("metadata", {})}
    return ReasoningTask(f"{name}/{split}/{index}", "reasoning", name, entry["question"], entry["answer"],
                         json.dumps(entry, default=str), opts)
