"""The domain registry: how a config's ``task.name`` (or a ``[[sources]]`` table's) becomes a domain.

A domain is a plugin: one ``DomainSpec`` object, exported by a module. The centre (config, run
plan, CLI, doctor, evaluation) reaches domains only through this registry; no other module of
the package names one. A name resolves, in this order, to

1. a built-in domain (``BUILTIN``, the one place the package lists its own);
2. an installed package's entry point in the group ``rlonce.domains``
   (``[project.entry-points."rlonce.domains"] mydomain = "mypkg.mydomain:DOMAIN"``);
3. an import string ``"package.module:ATTRIBUTE"``, importable from the working directory or an
   installed package.

Loading a domain imports only its spec module: the environment, its grader and its tools are
imported when the run builds the domain (``DomainSpec.build``). A name that does not resolve is
one ``ConfigError`` line at config load, before any model loads. docs/domains.md is the guide.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ConfigDict

from rlonce.config.sections import ConfigError, Section

ENTRY_POINT_GROUP = "rlonce.domains"
BUILTIN: dict[str, str] = {
    "toolfind": "rlonce.envs.toolfind:DOMAIN",
    "reasoning": "rlonce.envs.reasoning:DOMAIN",
    "code": "rlonce.envs.code:DOMAIN",
    "music": "rlonce.envs.music:DOMAIN",
    "cyber": "rlonce.envs.cyber:DOMAIN",
    "general": "rlonce.envs.general:DOMAIN",
    "visual": "rlonce.envs.visual:DOMAIN",
    "context": "rlonce.envs.context:DOMAIN",
}
"""The package's own domains, by name: the only list of them in the package."""
DEFAULT_DOMAIN = "toolfind"
"""``task.name`` when a config gives none: the embedded model's domain (``make quickstart``)."""


class DomainOptions(Section):
    """Base of a domain's options (the keys of ``[task]`` or of its ``[[sources]]`` table besides
    ``name`` and the source's own), checked like every other table: unknown keys, NaN, infinity and
    booleans for numbers are refused. Every key needs a default; state each number's bounds."""

    model_config = ConfigDict(frozen=True)


class NoOptions(DomainOptions):
    """A domain with no options."""


@dataclass(frozen=True)
class Need:
    """One thing a job needs from the machine, checked by ``rlonce doctor`` (its own checks and
    each domain's ``DomainSpec.needs``)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    """The one command that fixes a failure."""
    required: bool = True
    """False: a note (the job runs without it, more slowly or with less)."""

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.required else "--  ")
        fix = f"  ->  {self.fix}" if not self.ok and self.fix else ""
        return f"[{mark}] {self.name:<14} {self.detail}{fix}"


def need_program(program: str, apt: str, why: str, required: bool = True) -> Need:
    """A program on PATH, installed by the Debian package ``apt``."""
    found = shutil.which(program)
    return Need(program, found is not None, f"{found} ({why})" if found else f"not found ({why})",
                f"apt-get install -y {apt}", required)


def need_module(name: str, module: str, why: str, fix: str = "make venv", required: bool = True) -> Need:
    """A Python module the job imports."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return Need(name, found, ("installed" if found else "not installed") + f" ({why})", fix, required)


@dataclass(frozen=True, kw_only=True)
class PackTools:
    """What ``rlonce tasks`` offers for a domain's task packs. A callable may be given as an import
    string ``"package.module:function"``, imported when the verb runs (``resolve``). A handler raises
    ``ValueError`` (``rlonce.errors.PackError`` for a pack) with a one-line message of what the user
    must change; the CLI prints it as a usage error."""

    build: Callable | str | None = None
    """``(out: Path, settings, *, progress) → text``: write a pack of tasks into ``out`` (the CLI
    has checked it is writable) and say what it wrote (``rlonce tasks build <domain> --out DIR``).
    The pack's ``pack.json`` records ``"domain": <name>``, which ``tasks validate`` reads."""
    build_settings: type[DomainOptions] = NoOptions
    """``tasks build``'s own flags: each field is a ``--flag`` (``per_package`` → ``--per-package``),
    its docstring the help."""
    validate: Callable | str | None = None
    """``(pack: Path, *, reruns, progress) → (report, text)``: run the quality gates on the pack,
    write its ``validation.json``; ``report`` is what ``--json`` prints, ``text`` the summary line."""
    filter: bool = False
    """``rlonce tasks filter <domain>`` works on it: its train tasks are kept by their pass rate under
    a model (``rlonce.recipes.filter``), and its options' ``pack`` reads the folder."""
    recognises: Callable[[dict], bool] = field(default=lambda manifest: False)
    """Whether a ``pack.json`` that names no domain (a pack written before packs recorded it) is this
    domain's."""


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    """What ``rlonce probe <domain>`` asks of a domain's probe, from its flags. A probe reads the
    fields it lists in ``Probe.reads`` (and ``settings``, ``progress``)."""

    tasks: int = 50
    """Held-out tasks to probe, for a domain that generates its tasks."""
    limit: int | None = None
    """For a pack: probe this many validated tasks, spread evenly over the pack (None: all)."""
    shard: tuple[int, int] | None = None
    """``(i, n)``: only every n-th task starting at the i-th (1-based)."""
    routes: list[str] | None = None
    """A subset of the probe's routes (None: all; []: none, only the controls)."""
    concurrency: int = 2
    """Attempts at once."""
    record: Path | None = None
    """A JSONL file getting one line per attempt; attempts already in it are not run again."""
    judge: object | None = None
    """The judge the tasks' judged items are asked of (None: they are left out, as without one)."""
    settings: DomainOptions = field(default_factory=NoOptions)
    """The probe's own settings (``Probe.settings``)."""
    progress: bool = True


@dataclass(frozen=True, kw_only=True)
class Probe:
    """``rlonce probe <domain>``: known shortcut routes tried through the domain's own grading path,
    beside controls that must (and must not) earn reward. ``run`` and ``format_report`` may be
    import strings (``resolve``), so the spec module stays light."""

    run: Callable | str
    """``(options, request: ProbeRequest) → report``: a JSON-able dict. ``options`` is the domain's
    options model (``--pack DIR`` and the other option flags set it). Raises ``ValueError`` with a
    one-line message for a request it cannot serve (an unknown route, no pack)."""
    format_report: Callable | str
    """``(report) → text``, printed without ``--json``."""
    reads: tuple[str, ...] = ()
    """The ``ProbeRequest`` fields it uses; ``rlonce probe <domain>`` offers only their flags."""
    settings: type[DomainOptions] = NoOptions
    """The probe's own flags, one per field (e.g. code's ``interceptor``)."""

    def __post_init__(self):
        unknown = set(self.reads) - set(ProbeRequest.__dataclass_fields__) - {"settings", "progress"}
        if unknown:
            raise TypeError(f"Probe.reads: {sorted(unknown)} are not ProbeRequest fields")


def resolve(target: Callable | str, what: str) -> Callable:
    """``target`` itself, or the object an import string ``"package.module:attribute"`` names."""
    if callable(target):
        return target
    module_name, _, attr = str(target).partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{what}: cannot import {target!r} ({type(e).__name__}: {e})") from None
    return obj


@dataclass(frozen=True, kw_only=True)
class DomainSpec:
    """What a domain is, before it is built. A module exports one, e.g. ``DOMAIN = DomainSpec(...)``."""

    name: str
    """The source's label when a config gives none; the name in metrics, the ledger and reports."""
    build: Callable
    """``(options) → rlonce.envs.domains.Domain``: the task streams and the environment factory.
    Imports the environment's modules here, not at the spec module's top."""
    options: type[DomainOptions] = NoOptions
    """The domain's options: a ``DomainOptions`` subclass, every key with a default."""
    has_expert: bool = False
    """The built domain has a scripted expert, so SFT demonstrations can be made."""
    single_turn: bool = False
    """A task can be answered in one reply without tools (harness arm ``single-turn``)."""
    tools: bool = True
    """A task can be worked with tools (every other arm); False: ``single-turn`` only."""
    judge_rules: Callable[[], Mapping[str, Callable[[str], dict]]] | None = None
    """``() → {kind: rule}``: the scripted judge's rules (``rlonce.grading.scripted``) for the questions
    of ``kind`` this domain asks a judge; ``rule(prompt)`` → the reply object. Imports when called.
    None: it asks none (or none the scripted judge answers)."""
    base_corpus: Callable[[], object] | None = None
    """``() → rlonce.envs.domains.BaseCorpus``: the text a small base model for this domain is
    pre-trained and its tokenizer trained on (the embedded model's domain gives one:
    ``rlonce.recipes.pretrain``, ``rlonce.recipes.build_tokenizer``). Imports when called."""
    pack_audit: Callable[[], object] | None = None
    """``() → rlonce.envs.pack_audit.PackAudit``: what the offline grading tools (``rlonce tasks
    audit``, ``rlonce grade synthesize-rubrics``) need of this domain's packs: their validated tasks,
    the environment of an attempt, the scripted agents, what a judge reads. Imports when called.
    None: its packs (if any) are not graded offline."""
    needs: Callable[[DomainOptions], list[Need]] = field(default=lambda options: [])
    """What ``rlonce doctor`` checks for a run with this domain."""
    summary: str = ""
    """One line for ``rlonce domains`` and the docs."""
    packs: PackTools | None = None
    """What ``rlonce tasks build|validate|filter`` offer for its task packs; None: none (``tasks
    audit`` reads ``pack_audit``)."""
    probe: Probe | None = None
    """``rlonce probe <name>``: its shortcut routes against its grader; None: it has none."""

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise TypeError("DomainSpec.name must be a non-empty string")
        if not (isinstance(self.options, type) and issubclass(self.options, DomainOptions)):
            raise TypeError(f"domain {self.name!r}: options must be a DomainOptions subclass, "
                            f"not {self.options!r}")
        if not callable(self.build):
            raise TypeError(f"domain {self.name!r}: build must be callable")


_LOADED: dict[str, DomainSpec] = {}


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {e.name: e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _import(target: str, what: str) -> DomainSpec:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what}: {target!r} is not 'package.module:ATTRIBUTE'")
    if "" not in sys.path and os.getcwd() not in sys.path:  # a plugin next to the config, as `python -m` finds it
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # an import error, or the plugin's own code failing
        detail = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"{what}: cannot import {module_name!r} ({type(e).__name__}: {detail}); "
                          f"check the module is on PYTHONPATH or installed") from None
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"{what}: {module_name!r} has no attribute {attr!r}; export the DomainSpec as {attr}")
    if not isinstance(obj, DomainSpec):
        raise ConfigError(f"{what}: {target} is a {type(obj).__name__}, not a rlonce.config.domains.DomainSpec")
    return obj


def load_domain(name: str) -> DomainSpec:
    """The domain ``name`` gives (built-in, entry point or import string), imported once."""
    if name in _LOADED:
        return _LOADED[name]
    if name in BUILTIN:
        spec = _import(BUILTIN[name], f"built-in domain {name!r}")
    elif ":" in name:
        spec = _import(name, f"domain {name!r}")
    else:
        eps = _entry_points()
        if name not in eps:
            raise ConfigError(f"unknown domain {name!r}; known: {', '.join(domain_names())} (or give a plugin "
                              f"as 'package.module:DOMAIN', see docs/domains.md)")
        dist = eps[name].dist.name if eps[name].dist else "an installed package"
        spec = _import(eps[name].value, f"domain {name!r} (entry point of {dist})")
    _LOADED[name] = spec
    return spec


def loaded_domains() -> list[DomainSpec]:
    """The domains this process has loaded (``load_domain``), import strings included."""
    return list(_LOADED.values())


def domain_names() -> list[str]:
    """Built-in domains, then those installed packages register."""
    return [*BUILTIN, *sorted(set(_entry_points()) - set(BUILTIN))]


def plugin_provenance(names) -> dict[str, dict]:
    """For each domain in ``names`` that is not built in: the module its ``build`` lives in, the
    file(s) of that module (its whole folder when it is a package's) and their sha256. The package's
    own code is in the run's code digest; a plugin's is recorded here instead, so changing a plugin
    never blocks resuming a run that does not use it."""
    out = {}
    for n in sorted(set(names) - set(BUILTIN)):
        spec = load_domain(n)
        mod = sys.modules.get(spec.build.__module__)
        path = Path(getattr(mod, "__file__", None) or "")
        files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
        h = hashlib.sha256()
        for f in files:
            if f.is_file():
                h.update(str(f.relative_to(path.parent)).encode() + b"\0" + f.read_bytes())
        out[n] = {"domain": spec.name, "module": spec.build.__module__,
                  "path": str(path) if path.is_file() else None, "sha256": h.hexdigest() if path.is_file() else None}
    return out
