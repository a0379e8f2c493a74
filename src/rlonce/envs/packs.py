"""Task packs: folders of tasks built and validated ahead of a run (``rlonce tasks build``,
``rlonce tasks validate``, ``rlonce tasks filter``), and the domain a pack of validated tasks
makes. Any domain whose tasks come from a pack uses these: the train / held-out split by task id,
the audit's exclusions, the filter's kept indices.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pydantic import Field

from rlonce.config.domains import DomainOptions, Need
from rlonce.envs.domains import Domain, Expert
from rlonce.errors import PackError

log = logging.getLogger(__name__)


class PackOptions(DomainOptions):
    pack: str | None = None
    """(Required) a pack from ``rlonce tasks build <domain>`` checked by ``rlonce tasks validate``."""
    heldout_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of the validated pack's tasks held out for evaluation (split by task id)."""

HELDOUT_FRACTION = 0.2
SPLIT_RULE = ("a task is held out when the first 8 bytes of sha256(task id), read as a big-endian integer "
              "over 2**64, are below heldout_fraction; when that leaves the held-out or the train side empty "
              "(and there are two tasks or more), the lowest such number is held out and the highest trained on")


def _unit(task_id: str) -> float:
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big") / 2**64


def split_tasks(ids: list[str], heldout_fraction: float = HELDOUT_FRACTION) -> dict:
    """The train / held-out split of validated task ``ids`` by ``SPLIT_RULE``: each task's side
    depends on its own id only, so rebuilding or revalidating a pack never moves a task that
    stays in it (outside the small-pack fallback). Ids keep the order given."""
    held = {i for i in ids if _unit(i) < heldout_fraction}
    if len(set(ids)) >= 2 and heldout_fraction > 0:
        ranked = sorted(set(ids), key=_unit)
        if not held:
            held = {ranked[0]}
        elif held == set(ids):
            held.discard(ranked[-1])
    return {"rule": SPLIT_RULE, "heldout_fraction": heldout_fraction,
            "heldout_ids": [i for i in ids if i in held], "train_ids": [i for i in ids if i not in held]}


def record_split(pack: Path, split: dict) -> None:
    """Write ``split`` into ``pack``'s validation.json (atomically) unless it is already there."""
    path = Path(pack) / "validation.json"
    report = json.loads(path.read_text())
    if report.get("split") == split:
        return
    tmp = path.with_name(f".validation.json.{os.getpid()}")
    tmp.write_text(json.dumps({**report, "split": split}, indent=2) + "\n")
    os.replace(tmp, path)



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


def read_json_object(path: Path, remedy: str) -> dict:
    """The JSON object in ``path`` ({} when there is no such file); a ``PackError`` saying ``remedy``
    when it cannot be read or is not an object."""
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PackError(f"cannot read {path} ({e}); {remedy}") from None
    if not isinstance(obj, dict):
        raise PackError(f"{path} is not a JSON object; {remedy}")
    return obj


def audit_flagged(pack: Path) -> set[str]:
    """Ids ``rlonce tasks audit`` flagged (``DIR/audit.json``) that are not listed in ``DIR/cleared.txt``
    (one id a line, ``#`` starts a comment). The file names are ``rlonce.recipes.task_audit``'s."""
    entries = read_json_object(pack / "audit.json", f"rerun `rlonce tasks audit {pack}` or delete it")
    flagged = {i for i, e in entries.items() if isinstance(e, dict) and e.get("flags")}
    c = pack / "cleared.txt"
    cleared = {ln.split("#", 1)[0].strip() for ln in c.read_text().splitlines()} if c.is_file() else set()
    return flagged - cleared


def _pack_task(train: list, heldout: list, split: str, index: int):
    tasks = heldout if split == "heldout" else train
    if not tasks:
        raise PackError(f"the pack holds no {'held-out' if split == 'heldout' else 'train'} task; "
                        "validate more tasks or change task.heldout_fraction")
    return tasks[index % len(tasks)]


def pack_domain(name: str, task_cfg, validated_tasks: Callable, env_factory, expert: Expert) -> Domain:
    """A domain over the validated tasks of a built pack (code, cyber), split by task id
    (``split_tasks``; the split is written to the pack's validation.json). ``sft``
    draws from the train tasks too. Train tasks the audit flagged and no one cleared are left out
    (``audit_flagged``); the split is made before, so clearing a task never moves another."""
    pack = task_cfg.pack
    if not pack or not (Path(pack) / "pack.json").is_file():
        raise PackError(f"the {name} domain needs `pack` (task.pack, or the source's pack), a built and validated "
                        f"{name} pack ({pack or 'unset'} is not one): "
                        f"run `rlonce tasks build {name} --out DIR` and `rlonce tasks validate DIR`")
    if not (Path(pack) / "validation.json").is_file():
        raise PackError(f"the {name} pack {pack} was never validated: run `rlonce tasks validate {pack}`")
    tasks = validated_tasks(Path(pack))
    if not tasks:
        raise PackError(f"no task of the {name} pack {pack} passed validation; build a larger pack "
                        f"with `rlonce tasks build {name} --out DIR` and validate it")
    split = split_tasks([t.task_id for t in tasks], getattr(task_cfg, "heldout_fraction", HELDOUT_FRACTION))
    record_split(Path(pack), split)
    held = set(split["heldout_ids"])
    excluded = audit_flagged(Path(pack)) - held
    train = [t for t in tasks if t.task_id not in held and t.task_id not in excluded]
    dropped = sum(t.task_id in excluded for t in tasks)
    if dropped:
        log.warning("%d task(s) excluded by the audit; clear them in %s", dropped, Path(pack) / "cleared.txt")
    if not train and dropped:
        raise PackError(f"every train task of {pack} is flagged by `rlonce tasks audit`: review "
                        f"{Path(pack) / 'audit.json'} and list the ids you clear in {Path(pack) / 'cleared.txt'}")
    heldout = [dataclasses.replace(t, split="heldout") for t in tasks if t.task_id in held]
    return Domain(name, env_factory, partial(_pack_task, train, heldout), heldout_size=len(heldout), expert=expert,
                  audit_excluded=dropped)




def probed_tasks(name: str, pack: str | None, validated_tasks: Callable, request) -> list:
    """The validated tasks of ``pack`` a domain's probe runs on (``rlonce probe <name> --pack DIR``):
    ``request.limit`` of them spread evenly over the pack, then ``request.shard``'s."""
    if not pack:
        raise PackError(f"probe {name} needs --pack DIR (a validated {name} pack)")
    tasks = validated_tasks(Path(pack))
    if request.limit:
        tasks = tasks[:: max(1, len(tasks) // request.limit)][: request.limit]
    if request.shard:
        tasks = tasks[request.shard[0] - 1:: request.shard[1]]
    if not tasks:
        raise PackError(f"{pack} has no validated tasks to probe" + (" in this shard" if request.shard else ""))
    return tasks


def need_pack(pack: str | None, domain: str) -> Need:
    """``rlonce doctor``'s check of a domain's built and validated pack."""
    name = f"{domain} pack"
    if not pack:
        return Need(name, False, "the source's pack is not set",
                    f"rlonce tasks build {domain} --out runs/packs/{domain}")
    p = Path(pack)
    if not (p / "pack.json").is_file():
        return Need(name, False, f"{p} holds no pack", f"rlonce tasks build {domain} --out {p}")
    if not (p / "validation.json").is_file():
        return Need(name, False, f"{p} was never validated", f"rlonce tasks validate {p}")
    return Need(name, True, f"{p} built and validated")
