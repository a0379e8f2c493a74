"""Domains: what a job trains on — a task stream per split and the environment built around a task.

The GRPO job, the evaluator and ``rlonce tasks filter`` see a domain only through this record,
so a new domain is one ``Domain`` away from the whole loop. Splits: ``sft`` (demonstrations),
``train`` (RL), ``heldout`` (evaluation); each is an endless indexed stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rlonce.config import ConfigError
from rlonce.errors import PackError

SFT_TASK_OFFSET = 0
RL_TASK_OFFSET = 1_000_000
log = logging.getLogger(__name__)


@dataclass
class Domain:
    name: str
    """Also the task source name in the mixer and the ledger."""
    env_factory: Callable
    make: Callable[[str, int], object]
    """(split, index) → task."""
    kept: list[int] | None = None
    """Train indices a difficulty filter kept; the train stream then cycles through them."""
    single_turn: bool = False
    heldout_size: int | None = None
    """Distinct held-out tasks when the held-out stream repeats (a pack); None: endless."""
    expert: Callable | None = None
    """The scripted expert: ``(task, rng, fmt, *, translate, detour_p, max_detours, single_turn)``
    → its assistant turns as text (SFT demonstrations; ``single_turn``: for the ``single-turn``
    arm, else tool calls); None when the domain has none."""
    attach: Callable | None = None
    """``(run_dir or None, judge_for) → Domain``: binds what only the run has — its directory and a
    judge (``judge_for(name)`` → (judge or None, vision-capable)) — into the env factory."""
    audit_excluded: int = 0
    """Train tasks of a pack left out because ``rlonce tasks audit`` flagged them and no one cleared
    them (``audit_flagged``)."""

    @property
    def has_expert(self) -> bool:
        return self.expert is not None

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


def _toolfind(task_cfg) -> Domain:
    from rlonce.envs.toolfind.env import ToolfindEnv
    from rlonce.envs.toolfind.expert import expert_turns

    return Domain("toolfind", ToolfindEnv, partial(_toolfind_task, task_cfg.two_hop_fraction), expert=expert_turns)


def _reasoning(task_cfg) -> Domain:
    from rlonce.envs.reasoning.env import SYSTEM_PROMPT, ReasoningEnv
    from rlonce.envs.reasoning.expert import expert_turns
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
    return Domain("reasoning", env, lambda split, i: make_task(split, i, datasets, options), kept=kept,
                  single_turn=True, expert=expert_turns)


def _code_task(train: list, heldout: list, split: str, index: int):
    tasks = heldout if split == "heldout" else train
    if not tasks:
        raise PackError(f"the pack holds no {'held-out' if split == 'heldout' else 'train'} task; "
                        "validate more tasks or change task.heldout_fraction")
    return tasks[index % len(tasks)]


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
    (one id a line, ``#`` starts a comment). The file names are ``rlonce.grading.audit``'s."""
    entries = read_json_object(pack / "audit.json", f"rerun `rlonce tasks audit {pack}` or delete it")
    flagged = {i for i, e in entries.items() if isinstance(e, dict) and e.get("flags")}
    c = pack / "cleared.txt"
    cleared = {ln.split("#", 1)[0].strip() for ln in c.read_text().splitlines()} if c.is_file() else set()
    return flagged - cleared


def _pack_domain(name: str, task_cfg, validated_tasks: Callable, env_factory, expert) -> Domain:
    """A domain over the validated tasks of a built pack (code, cyber), split by task id
    (``code.validate.split_tasks``; the split is written to the pack's validation.json). ``sft``
    draws from the train tasks too. Train tasks the audit flagged and no one cleared are left out
    (``audit_flagged``); the split is made before, so clearing a task never moves another."""
    import dataclasses

    from rlonce.envs.code.validate import HELDOUT_FRACTION, record_split, split_tasks

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
    return Domain(name, env_factory, partial(_code_task, train, heldout), heldout_size=len(heldout), expert=expert,
                  audit_excluded=dropped)


def _code(task_cfg) -> Domain:
    from rlonce.envs.code.env import CodeEnv
    from rlonce.envs.code.expert import expert_turns
    from rlonce.envs.code.validate import validated_tasks

    return _pack_domain("code", task_cfg, validated_tasks, partial(CodeEnv, trust_validation=True), expert_turns)


def _music_task(max_bars: int, split: str, index: int):
    from rlonce.envs.music.tasks import make_task

    return make_task(split, index, max_bars=max_bars)


def _music(task_cfg) -> Domain:
    from rlonce.envs.music.env import MusicEnv
    from rlonce.envs.music.expert import expert_turns

    env = partial(MusicEnv, adherence_weight=task_cfg.adherence_weight)
    return Domain("music", env, partial(_music_task, task_cfg.max_bars), expert=expert_turns)


def _cyber(task_cfg) -> Domain:
    from rlonce.envs.cyber.env import CyberEnv
    from rlonce.envs.cyber.expert import expert_turns
    from rlonce.envs.cyber.validate import validated_tasks

    return _pack_domain("cyber", task_cfg, validated_tasks, CyberEnv, expert_turns)


def _general(task_cfg) -> Domain:
    from rlonce.envs.general.env import GeneralEnv
    from rlonce.envs.general.expert import expert_turns
    from rlonce.envs.general.tasks import make_task

    def attach(run_dir, judge_for) -> Domain:
        judge, _ = judge_for("general-judge")
        agreement, _ = judge_for("general-agreement", "agreement_judge") if judge is not None else (None, False)
        env = partial(GeneralEnv, reward=task_cfg.rubric_reward, judge=judge, agreement=agreement)
        return Domain("general", env, make_task, expert=expert_turns)

    return Domain("general", partial(GeneralEnv, reward=task_cfg.rubric_reward), make_task, expert=expert_turns,
                  attach=attach)


def _visual(task_cfg) -> Domain:
    from rlonce.envs.visual.expert import expert_turns
    from rlonce.envs.visual.factory import VisualFactory
    from rlonce.envs.visual.render import require_browser
    from rlonce.envs.visual.tasks import make_task

    require_browser()  # a one-line error naming the package, before any rollout starts
    family = task_cfg.visual_family

    def attach(run_dir, judge_for) -> Domain:
        judge = None
        if family != "replication":
            judge, vision = judge_for("visual-judge")
            if judge is None or not vision:
                raise ConfigError(f"visual_family = {family!r} needs a vision-capable judge: set grading.judge "
                                  "(kind, base_url, model) and grading.judge.vision = true, or use 'replication'")
        return Domain(name, VisualFactory(shots_dir=run_dir / "visual" if run_dir else None, judge=judge),
                      make, single_turn=True, expert=expert_turns)

    def make(split: str, index: int):
        # held-out evaluation grades attempts alone: only replication tasks can be scored that way
        return make_task(split, index, family="replication" if split == "heldout" else family,
                         layouts=task_cfg.visual_layouts)

    name = "visual"
    return Domain(name, VisualFactory(), make, single_turn=True, expert=expert_turns, attach=attach)


@dataclass(frozen=True)
class DomainEntry:
    """What the registry knows about a domain before building it (nothing is imported)."""

    build: Callable[[object], Domain]
    """``TaskConfig`` → the domain; imports the environment's modules only when called."""
    has_expert: bool
    """A scripted expert exists, so SFT demonstrations can be made."""
    single_turn: bool
    """The task can be answered in one reply with no tools (harness arm ``single-turn``)."""
    tools: bool = True
    """The task can be worked with tools (every other arm); False: ``single-turn`` only."""


DOMAINS: dict[str, DomainEntry] = {
    "toolfind": DomainEntry(_toolfind, has_expert=True, single_turn=False),
    "reasoning": DomainEntry(_reasoning, has_expert=True, single_turn=True, tools=False),
    "code": DomainEntry(_code, has_expert=True, single_turn=False),
    "music": DomainEntry(_music, has_expert=True, single_turn=True),
    "cyber": DomainEntry(_cyber, has_expert=True, single_turn=False),
    "general": DomainEntry(_general, has_expert=True, single_turn=False),
    "visual": DomainEntry(_visual, has_expert=True, single_turn=True),
}
"""Every domain a job can train on, by the name ``task.name`` gives."""


def domain_for(task_cfg) -> Domain:
    """The domain a ``TaskConfig`` names."""
    try:
        entry = DOMAINS[task_cfg.name]
    except KeyError:
        raise ConfigError(f"unknown task {task_cfg.name!r}; known: {', '.join(DOMAINS)}") from None
    return entry.build(task_cfg)

