"""Reading a config: ``key.sub=value`` overrides, TOML and saved-JSON files, and validation
errors turned into one line that names the key, its bounds or the keys the section knows.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, ValidationError

from rlonce.config.objectives import _VARIANTS, AlgoConfig
from rlonce.config.run import RunConfig
from rlonce.config.sections import ConfigError, bounds


def _parse_value(raw: str):
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if raw.startswith("[") and raw.endswith("]"):  # a list of bare strings: [mini-bash, mini-codex]
            return [_parse_value(x.strip()) for x in raw[1:-1].split(",") if x.strip()]
        if raw.lower() in ("nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "-infinity"):
            return float(raw)  # refused by the schema with the key named, not taken as a string
        return raw  # a bare string
    except RecursionError:
        raise ConfigError(f"override value {raw[:40]!r}… is nested too deeply") from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """``data`` with the ``key=value`` overrides applied, as a new table (``data`` is left as it was)."""
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. rl.steps=10)")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r} has an empty key part; write key=value, e.g. rl.steps=10")
        node = data
        for p in parts[:-1]:
            if isinstance(node, list):  # a table of an array (``[[sources]]``): by index or label
                node = _item(node, p, key)
                continue
            if isinstance(node.get(p), str):  # a variant given by name, now given a parameter
                node[p] = {"name": node[p]}
            node = node.setdefault(p, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
        if isinstance(node, list):
            where, last = ".".join(parts[:-1]), parts[-1]
            raise ConfigError(f"override {key!r}: {where!r} is a list of tables; name one of them, "
                              f"e.g. {where}.0.{last}=... or {where}.<label>.{last}=...")
        node[parts[-1]] = _parse_value(raw.strip())
    return data


def _item(tables: list, part: str, key: str) -> dict:
    """The table ``part`` names in an array of tables: its index, or its ``label`` (else ``name``)."""
    if part.isdigit():
        if int(part) < len(tables):
            return tables[int(part)]
    else:
        hits = [t for t in tables if isinstance(t, dict) and t.get("label", t.get("name")) == part]
        if len(hits) == 1:
            return hits[0]
    names = ", ".join(str(t.get("label", t.get("name"))) for t in tables if isinstance(t, dict))
    raise ConfigError(f"override {key!r}: no single table {part!r} among {len(tables)} ({names}); "
                      "name one by its index or its label")


def _section_type(annotation):
    """The Section class inside ``X``, ``X | None`` or ``list[X]``, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in get_args(annotation):
        found = _section_type(a)
        if found is not None:
            return found
    return None


def _field_at(loc: list[str]):
    """The FieldInfo a validation error points at (None when it is not a plain field)."""
    section: type[BaseModel] | None = RunConfig
    info = None
    for p in loc:
        if section is None:
            return None
        if p in _VARIANTS and info is not None and info.annotation is AlgoConfig.model_fields["objective"].annotation:
            section = _VARIANTS[p]
            continue
        info = section.model_fields.get(p)
        if info is None:
            return None
        section = _section_type(info.annotation)
    return info


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _explain(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = [str(p) for p in e["loc"] if not isinstance(p, int)]
    if e["type"] == "extra_forbidden":
        section: type[BaseModel] = RunConfig
        path = []
        at_objective = False
        for p in loc[:-1]:
            if p in _VARIANTS and at_objective:
                section, at_objective = _VARIANTS[p], False
                continue
            path.append(p)
            at_objective = section is AlgoConfig and p == "objective"
            section = _section_type(section.model_fields[p].annotation)  # type: ignore[assignment]
        key = ".".join([*path, loc[-1]])
        known = ", ".join(section.model_fields)
        return f"unknown config key {key!r}; known keys here: {known}"
    while loc and loc[-1] in ("int", "float"):  # the member of a number union pydantic tried last
        loc.pop()
    msg = str(e["msg"]).removeprefix("Value error, ")
    key = ".".join(p for p in loc if p not in _VARIANTS)
    if not loc or key + "." in msg:  # a whole-config or section rule whose message names its keys
        return msg
    if e["type"] == "model_type":
        section = _section_type(_field_at(loc).annotation) if _field_at(loc) else None
        example = f"{key}.{next(iter(section.model_fields))}=..." if section else f"{key}.KEY=..."
        return f"config key {key!r} is a section, not a value ({_shown(e['input'])}); set its keys, e.g. {example}"
    if "Value error" in str(e["msg"]):  # a section-wide rule
        return f"config key {key!r}: {msg}"
    if e["type"] == "list_type" and isinstance(e["input"], str):  # a TOML list written as one bare value
        return (f"config key {key!r} = {_shown(e['input'])}: a list is needed; write it in brackets, e.g. "
                f"{key}=[{e['input']}]")
    info = _field_at(loc)
    bound = bounds(info) if info is not None else ""
    if e["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number",
                     "int_parsing_size") and bound:
        return f"config key {key!r} = {_shown(e['input'])} is out of range: use a finite value in {bound}"
    return f"config key {key!r} = {_shown(e['input'])}: {msg}" + (f" (bounds: {bound})" if bound else "")


def validate(data: dict, overrides: list[str] | None = None) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a table of keys, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(apply_overrides(data, overrides or []))
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None


def _read_text(p: Path, what: str) -> str:
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a directory; pass a file")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{what} {p} is not a regular file; pass a file")
    if not p.is_file():
        raise ConfigError(f"{what} {p} does not exist")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {p} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {p}: {e.strerror or e}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    data: dict = {}
    if path is not None:
        p = Path(path)
        text = _read_text(p, "config file")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML: {e}") from None
        except RecursionError:
            raise ConfigError(f"{p} is not usable TOML: nested too deeply") from None
    return validate(data, overrides)


def save_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")


def read_saved_config(path: Path, overrides: list[str] | None = None) -> RunConfig:
    try:
        data = json.loads(_read_text(path, "saved config"))
    except (json.JSONDecodeError, RecursionError) as e:
        reason = str(e).splitlines()[0] if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        raise ConfigError(f"{path} is not a usable saved config: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a usable saved config: not a JSON object")
    return validate(data, overrides)
