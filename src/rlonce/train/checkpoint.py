"""Checkpoints: ``checkpoints/step-N/`` holds Hugging Face weights (under LoRA the adapter alone, in
peft's format: ``adapter_model.safetensors`` + ``adapter_config.json``, which names its base) + tokenizer, and
``trainer_state.pt`` with the optimizer, run state (phase, step, data position, policy
version) and RNG states — everything ``rlonce train --resume`` needs. Written to a temporary
folder and renamed, so a crash never leaves a half-written latest checkpoint.

Disk space is checked before writing (weights and optimizer tensors plus a margin for the
tokenizer and run state); a write that still fails for lack of space removes the temporary
folder and is a one-line ``CheckpointError`` naming the path and the space it needs. A
checkpoint that does not load (truncated, corrupt, not ours) is a ``CheckpointError`` naming
the file and the way out.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
import traceback
from pathlib import Path

from rlonce.core import faults
from rlonce.errors import RlonceError

STATE_FILE = "trainer_state.pt"
MARGIN_BYTES = 4 << 20
"""Room for the tokenizer files, the config and the pickled run state beyond the tensors."""
_FULL = (errno.ENOSPC, errno.EDQUOT)


class NoCheckpoint(RlonceError, FileNotFoundError):
    pass


class CheckpointError(RlonceError, RuntimeError):
    """A checkpoint cannot be written (no space) or read (damaged); the message says what to do."""


def rng_state() -> dict:
    import torch

    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def restore_rng(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def tensor_bytes(obj, _seen: set | None = None) -> int:
    """Bytes of the distinct tensors inside ``obj`` (nested dicts, lists, tuples); tied weights count once."""
    import torch

    seen = set() if _seen is None else _seen
    if isinstance(obj, torch.Tensor):
        key = (obj.data_ptr(), obj.numel(), obj.dtype)
        if key in seen:
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _disk_full(e: BaseException, root: Path) -> bool:
    if isinstance(e, OSError) and e.errno in _FULL:
        return True
    text = f"{e} {e.__context__}"
    if "No space left" in text or "Disk quota exceeded" in text:
        return True
    # torch.save reports a failed write as a RuntimeError without the errno ("iostream error",
    # "unexpected pos"): the device being (nearly) full is what tells
    return shutil.disk_usage(root).free < MARGIN_BYTES


def _release(e: BaseException) -> None:
    """Clear the frames of ``e`` and the exceptions behind it: a failed writer's open file lives in
    them, and its space stays taken until it is closed."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def save(out: Path, step: int, lm, *, run_state: dict, rl_trainer: dict | None, keep: int = 2,
         meta: dict | None = None) -> Path:
    """Write checkpoint ``step`` atomically (a temporary folder renamed into place); ``meta`` goes
    to its ``provenance.json`` (the config and code digests it was written under)."""
    import torch

    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:04d}"
    tmp = root / f".tmp-step-{step:04d}"
    for stale in root.glob(".tmp-step-*"):  # left by a killed process: never a usable checkpoint
        shutil.rmtree(stale, ignore_errors=True)
    weights = lm.peft if lm.peft is not None else lm.model  # under LoRA the adapter alone
    state = _adapter_state(lm.peft) if lm.peft is not None else lm.model.state_dict()
    need = tensor_bytes(state) + tensor_bytes(rl_trainer) + MARGIN_BYTES
    free = shutil.disk_usage(root).free
    if free < need:
        raise CheckpointError(f"not enough disk space for checkpoint {final}: it needs about {_mib(need)}, "
                              f"{_mib(free)} free; free space, lower checkpoint.keep or choose another --out")
    try:
        weights.save_pretrained(tmp)
        lm.tokenizer.save_pretrained(tmp)
        faults.point("checkpoint.weights")
        torch.save({"run_state": run_state, "rl_trainer": rl_trainer, "rng": rng_state()}, tmp / STATE_FILE)
        if meta is not None:
            (tmp / "provenance.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    except BaseException as e:
        _release(e)
        written = _du(tmp)
        full = isinstance(e, Exception) and _disk_full(e, root)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise CheckpointError(f"disk full writing checkpoint {final} after {_mib(written)}: it needs about "
                                  f"{_mib(max(need, written + MARGIN_BYTES))}, {_mib(free)} were free; free space, "
                                  "lower checkpoint.keep or choose another --out (the partial checkpoint was "
                                  "removed)") from None
        raise
    faults.point("checkpoint.rename")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    faults.point("checkpoint.prune")
    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _adapter_state(peft) -> dict:
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(peft)


def exists(out: Path) -> bool:
    """Whether ``out`` has a complete checkpoint to resume from."""
    return any((p / STATE_FILE).is_file() for p in (out / "checkpoints").glob("step-*"))


def latest(out: Path) -> Path:
    found = sorted(p for p in (out / "checkpoints").glob("step-*") if (p / STATE_FILE).is_file())
    if not found:
        raise NoCheckpoint(f"{out} has no checkpoint to resume from (expected {out}/checkpoints/step-N/{STATE_FILE})")
    return found[-1]


def _way_out(ckpt: Path) -> str:
    earlier = sorted(p for p in ckpt.parent.glob("step-*") if p < ckpt and (p / STATE_FILE).is_file())
    if earlier:
        return f"delete {ckpt} to resume from {earlier[-1].name}, or start over without --resume"
    return "start the run over without --resume (or with another --out)"


def damaged(ckpt: Path, what: Path, reason: str) -> CheckpointError:
    """The one-line error for a checkpoint part that does not load."""
    return CheckpointError(f"checkpoint {what} does not load ({reason}); {_way_out(ckpt)}")


def load_state(ckpt: Path) -> dict:
    import torch

    path = ckpt / STATE_FILE
    try:
        state = torch.load(path, weights_only=False)
    except Exception as e:  # truncated zip, bad pickle, unreadable file: all mean the same to the user
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise damaged(ckpt, path, f"truncated or corrupt: {type(e).__name__}: {first[:160]}") from None
    if not (isinstance(state, dict) and isinstance(state.get("run_state"), dict) and isinstance(state.get("rng"), dict)
            and {"python", "torch"} <= state["rng"].keys()):
        raise damaged(ckpt, path, "not an rlonce trainer state")
    return state


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
