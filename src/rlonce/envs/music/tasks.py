"""Music tasks: a generated request (key, meter, length in bars, tempo, instrument, form).

Requests come from ``compose.random_request`` seeded by split and index, so each split is an
endless reproducible stream and the splits (train, held-out, SFT) never share a seed; the
reference corpus uses yet another seed (``reference.CORPUS_SEED``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlonce.envs.music.compose import Request, random_request

SPLIT_SEEDS = {"train": 41_001, "heldout": 42_002, "sft": 43_003}


@dataclass(frozen=True)
class MusicTask:
    task_id: str
    source: str
    request: Request

    @property
    def prompt(self) -> str:
        r = self.request
        mode = "minor" if r.key.endswith("m") else "major"
        return (f"Write a tune in ABC notation: {r.key.rstrip('m')} {mode} (K:{r.key}), meter {r.meter}, "
                f"{r.bars} bars, tempo Q:1/4={r.tempo}, {r.instrument} (%%MIDI program {r.program}), form {r.form} "
                f"({len(r.form)} sections of {r.section_bars} bars; equal letters repeat). "
                "Answer with one fenced ```abc block starting with X:.")


def make_task(split: str, index: int, source: str = "music", max_bars: int = 24) -> MusicTask:
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; known: {sorted(SPLIT_SEEDS)}")
    rng = random.Random(f"{SPLIT_SEEDS[split]}:{index}")
    return MusicTask(f"music/{split}/{index}", source, random_request(rng, max_bars))
