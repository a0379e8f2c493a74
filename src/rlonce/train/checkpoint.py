"""Checkpoints: ``checkpoints/step-N/`` holds Hugging Face weights + tokenizer, and
``trainer_state.pt`` with the optimizer, run state (phase, step, data position, policy
version) and RNG states — everything ``rlonce train --resume`` needs. Written to a temporary
folder and renamed, so a crash never leaves a half-written latest checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

STATE_FILE = "trainer_state.pt"


class NoCheckpoint(FileNotFoundError):
    pass


def rng_state() -> dict:
    import torch

    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def restore_rng(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save(out: Path, step: int, lm, *, run_state: dict, rl_trainer: dict | None, keep: int = 2) -> Path:
    import torch

    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:04d}"
    tmp = root / f".tmp-step-{step:04d}"
    shutil.rmtree(tmp, ignore_errors=True)
    lm.model.save_pretrained(tmp)
    lm.tokenizer.save_pretrained(tmp)
    torch.save({"run_state": run_state, "rl_trainer": rl_trainer, "rng": rng_state()}, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(out: Path) -> Path:
    found = sorted(p for p in (out / "checkpoints").glob("step-*") if (p / STATE_FILE).is_file())
    if not found:
        raise NoCheckpoint(f"{out} has no checkpoint to resume from (expected {out}/checkpoints/step-N/{STATE_FILE})")
    return found[-1]


def load_state(ckpt: Path) -> dict:
    import torch

    return torch.load(ckpt / STATE_FILE, weights_only=False)


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
