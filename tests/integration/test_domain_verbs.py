"""The CLI's domain verbs iterate the registry (issue 57): ``rlonce domains`` lists every built-in
domain with its options, verbs and needs; a plugin domain given as an import string gets ``rlonce
probe`` and ``rlonce tasks build|validate`` with flags made from its own models, its pack is
dispatched by the domain its pack.json names, and what it refuses is one line."""

from __future__ import annotations

import json
import subprocess
import sys

from rlonce.config.domains import BUILTIN, load_domain

PLUGIN = '''
from pydantic import Field

from rlonce.config.domains import DomainOptions, DomainSpec, PackTools, Probe


class Options(DomainOptions):
    size: int = Field(3, ge=1, le=10)
    """Items per task."""


class BuildSettings(DomainOptions):
    count: int = Field(2, ge=1, le=5)
    """Tasks to write."""


class ProbeSettings(DomainOptions):
    loud: bool = False
    """Shout."""


def build(o):
    raise NotImplementedError


def write(out, settings, *, progress):
    (out / "pack.json").write_text('{"domain": "tinyplug:DOMAIN"}')
    (out / "tasks.txt").write_text("x\\n" * settings.count)
    return f"wrote {settings.count} tasks to {out}"


def validate(pack, *, reruns, progress):
    n = len((pack / "tasks.txt").read_text().split())
    return {"tasks": n, "reruns": reruns}, f"{n} tasks validated"


def run(options, request):
    if "nope" in (request.routes or []):
        raise ValueError("unknown probe route(s) nope; known: echo")
    return {"size": options.size, "tasks": request.tasks, "routes": request.routes, "loud": request.settings.loud}


DOMAIN = DomainSpec(name="tinyplug", build=build, options=Options, summary="a plugin of the tests",
                    packs=PackTools(build=write, build_settings=BuildSettings, validate=validate),
                    probe=Probe(run=run, format_report=lambda r: f"size {r['size']}", reads=("tasks", "routes"),
                                settings=ProbeSettings))
'''


def rlonce(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rlonce.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def one_line(r) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlonce: error: "), r.stderr
    return lines[0]


def test_domains_lists_every_builtin_with_options_verbs_and_needs():
    r = rlonce("domains", "--json")
    assert r.returncode == 0, r.stderr
    rows = {d["name"]: d for d in json.loads(r.stdout)}
    assert list(rows)[:len(BUILTIN)] == list(BUILTIN)
    for name in BUILTIN:
        spec = load_domain(name)
        d = rows[name]
        assert d["origin"] == "built in" and d["summary"] == spec.summary
        assert d["options"] == spec.options().model_dump(mode="json")
        assert (d["expert"], d["single_turn"], d["tools"]) == (spec.has_expert, spec.single_turn, spec.tools)
        assert all(isinstance(n["ok"], bool) and n["name"] for n in d["needs"])
        assert (f"probe {name}" in d["verbs"]) == (spec.probe is not None)
    assert rows["code"]["verbs"] == ["tasks build code", "tasks validate DIR", "tasks audit DIR",
                                     "grade synthesize-rubrics --pack DIR", "probe code"]
    assert rows["reasoning"]["verbs"] == ["tasks filter reasoning"] and rows["toolfind"]["verbs"] == []
    assert rows["toolfind"]["options"] == {"two_hop_fraction": 0.6}
    code_pack = next(n for n in rows["code"]["needs"] if n["name"] == "code pack")
    assert not code_pack["ok"] and code_pack["fix"].startswith("rlonce tasks build code")  # default options: no pack
    text = rlonce("domains")
    assert text.returncode == 0 and all(f"\n{n}  " in "\n" + text.stdout for n in BUILTIN)
    assert "verbs: tasks build code, tasks validate DIR" in text.stdout


def test_a_plugin_given_by_import_string_is_probed_and_builds_and_validates_its_packs(tmp_path):
    (tmp_path / "tinyplug.py").write_text(PLUGIN)
    r = rlonce("probe", "tinyplug:DOMAIN", "--size", "5", "--tasks", "7", "--routes", "a, b", "--loud", "--json",
               "--no-hostile", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"size": 5, "tasks": 7, "routes": ["a", "b"], "loud": True}
    r = rlonce("probe", "tinyplug:DOMAIN", "--routes", "none", "--no-hostile", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "size 3\n", r.stderr
    assert "--size: 11 is out of range: use 1..10" in one_line(rlonce("probe", "tinyplug:DOMAIN", "--size", "11",
                                                                      cwd=tmp_path))
    assert "unknown probe route(s) nope" in one_line(rlonce("probe", "tinyplug:DOMAIN", "--routes", "nope",
                                                            "--no-hostile", cwd=tmp_path))
    assert "unrecognized arguments: --limit" in one_line(rlonce("probe", "tinyplug:DOMAIN", "--limit", "3",
                                                                cwd=tmp_path))
    assert "cannot import 'nosuchplug'" in one_line(rlonce("probe", "nosuchplug:DOMAIN", cwd=tmp_path))

    pack = tmp_path / "pack"
    r = rlonce("tasks", "build", "tinyplug:DOMAIN", "--out", str(pack), "--count", "4", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == f"wrote 4 tasks to {pack}; next: rlonce tasks validate {pack}\n", r.stderr
    r = rlonce("tasks", "validate", str(pack), "--reruns", "2", "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout) == {"tasks": 4, "reruns": 2}, r.stderr
    assert "--count: 9 is out of range: use 1..5" in one_line(rlonce("tasks", "build", "tinyplug:DOMAIN", "--out",
                                                                     str(tmp_path / "q"), "--count", "9", cwd=tmp_path))
    assert not (tmp_path / "q").exists()  # refused before anything is written


def test_validate_finds_the_pack_domain_or_says_what_is_missing(tmp_path):
    (tmp_path / "pack.json").write_text('{"seed": 0}')
    assert "names no domain" in one_line(rlonce("tasks", "validate", str(tmp_path)))
    (tmp_path / "pack.json").write_text('{"domain": "nosuch"}')
    assert "unknown domain 'nosuch'" in one_line(rlonce("tasks", "validate", str(tmp_path)))
    (tmp_path / "pack.json").write_text('{"domain": "music"}')
    assert "the music domain has no `tasks validate`" in one_line(rlonce("tasks", "validate", str(tmp_path)))
    assert "is not a task pack" in one_line(rlonce("tasks", "validate", str(tmp_path / "none")))
