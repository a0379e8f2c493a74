"""The config as text: ``reference()`` for docs/config.md (every key, default, bounds and
docstring) and ``settings()`` for ``rlonce config show`` (a resolved config, key by key).
"""

from __future__ import annotations

import json
from typing import NamedTuple, get_origin

from pydantic import BaseModel

from rlonce.config.load import _section_type, bounds
from rlonce.config.objectives import _VARIANTS, AlgoConfig, PenaltyConfig
from rlonce.config.run import RunConfig
from rlonce.config.sources import TaskConfig


def _toml(value, exact: bool = False) -> str:
    """``value`` as TOML text (None as 'unset'); floats shortened unless ``exact``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value) if exact else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v, exact) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v, exact)}" for k, v in value.items()) + "}"
    return json.dumps(value) if isinstance(value, str) else str(value)


def reference() -> str:
    """Every config key with its default, bounds and description, as Markdown table rows
    (docs/config.md holds this text; a test keeps them equal)."""
    rows = ["| key | default | bounds | meaning |", "|---|---|---|---|"]

    def walk(section: type[BaseModel], prefix: str) -> None:
        for name, info in section.model_fields.items():
            key = f"{prefix}{name}"
            if name == "name" and section in _VARIANTS.values():
                continue
            sub = _section_type(info.annotation)
            if name == "objective" and section is AlgoConfig:
                rows.append(f"| `{key}` | `\"ppo\"` | {', '.join(_VARIANTS)} | {' '.join(info.description.split())} |")
                for variant in _VARIANTS.values():
                    walk(variant, f"{key}.")  # one row per variant's parameter, variant named in the text
                continue
            listed = sub is not None and get_origin(info.annotation) is list
            if sub is not None and not listed:
                walk(sub, f"{key}.")
                continue
            if info.is_required():
                default = "required"
            elif sub is PenaltyConfig:
                default = "[" + ", ".join(p.rule for p in info.get_default(call_default_factory=True)) + "] (monitor)"
            else:
                default = _toml(info.get_default(call_default_factory=True))
            owner = f"{section.model_fields['name'].default}: " if section in _VARIANTS.values() else ""
            desc = owner + " ".join((info.description or "").split())
            rows.append(f"| `{key}` | `{default}` | {bounds(info) or '—'} | {desc.replace('|', '/')} |")
            if listed:
                walk(sub, f"{key}[].")
        if section is TaskConfig:  # a [[sources]] table takes the same domain keys
            domain_rows(prefix)

    def domain_rows(prefix: str) -> None:
        """Each built-in domain's options, as keys of ``[task]`` (or of a ``[[sources]]`` table)."""
        from rlonce.config.domains import BUILTIN, load_domain

        owners: dict[tuple, list[str]] = {}
        for d in BUILTIN:
            for name, info in load_domain(d).options.model_fields.items():
                owners.setdefault((name, id(info)), [info]).append(d)
        for (name, _), (info, *domains) in owners.items():
            desc = f"{', '.join(domains)}: " + " ".join((info.description or "").split())
            default = _toml(info.get_default(call_default_factory=True))
            rows.append(f"| `{prefix}{name}` | `{default}` | {bounds(info) or '—'} | {desc.replace('|', '/')} |")

    walk(RunConfig, "")
    return "\n".join(rows) + "\n"


class Setting(NamedTuple):
    """One key of a resolved config, as ``rlonce config show`` prints it."""

    key: str
    value: object
    default: object
    bounds: str
    doc: str

    def text(self) -> str:
        """``key = value`` (as an override writes it; None shows as 'unset'), then, indented, the
        docstring, the default (or 'the default' when the value is it) and the bounds."""
        more = "the default" if self.value == self.default else f"default {_toml(self.default, True)}"
        more += f"; bounds {self.bounds}" if self.bounds else ""
        return f"{self.key} = {_toml(self.value, True)}\n    {self.doc} ({more})"


def _plain(value):
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def settings(cfg: RunConfig) -> list[Setting]:
    """Every key of ``cfg`` with its resolved value, default, bounds and docstring, in schema order.
    ``algo.objective`` is its variant's name, followed by that variant's parameters only;
    ``algo.penalties`` is one value, a list of tables."""
    out: list[Setting] = []

    def walk(section: BaseModel, prefix: str) -> None:
        for name, info in type(section).model_fields.items():
            if name == "name" and type(section) in _VARIANTS.values():
                continue
            key, value = f"{prefix}{name}", getattr(section, name)
            default = info.get_default(call_default_factory=True)
            doc = " ".join((info.description or "").split())
            if isinstance(value, BaseModel):
                if name == "objective":
                    out.append(Setting(key, value.name, default.name, "", doc))
                walk(value, f"{key}.")
            else:
                out.append(Setting(key, _plain(value), _plain(default), bounds(info), doc))
        if isinstance(section, TaskConfig):  # the domain's own options, after the name that chose them
            walk(section.domain_options(), prefix)

    walk(cfg, "")
    return out
