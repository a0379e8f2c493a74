"""code: repair a real package's mutated function in a sandboxed checkout, graded by its tests."""

import subprocess
from typing import Literal

from pydantic import Field, field_validator

from rlonce.config.domains import DomainOptions, DomainSpec, Need, PackTools, Probe, need_program
from rlonce.envs.packs import PackOptions


class BuildSettings(DomainOptions):
    """``rlonce tasks build code``'s flags."""

    per_package: int = Field(40, ge=1, le=100_000)
    """Tasks per package."""
    packages: str | None = None
    """Comma-separated subset of the pinned packages (default: all)."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seed of the mutations drawn."""
    operators: str | None = None
    """Difficulty: comma-separated mutation operators drawn (default: all). The easy tier's
    one-token edits: ``binop,compare,off_by_one,bool_op``."""
    max_function_lines: int | None = Field(None, ge=2, le=10_000)
    """Difficulty: only mutate inside functions of at most this many lines (default: any site)."""
    message_lines: int = Field(1, ge=1, le=40)
    """Difficulty: lines of the failing test's message the problem statement quotes."""

    @field_validator("operators", "packages")
    @classmethod
    def _known(cls, names: str | None, info) -> str | None:
        from rlonce.envs.code.mutate import OPERATORS
        from rlonce.envs.code.packages import PACKAGES

        known, noun, what = ((OPERATORS, "operator", "operators") if info.field_name == "operators"
                             else (PACKAGES, "package", "pinned packages"))
        unknown = [n for n in names.split(",") if n not in known] if names else []
        if unknown:
            raise ValueError(f"unknown {noun}(s) {', '.join(unknown)}; {what}: {', '.join(known)}")
        return names


class ProbeSettings(DomainOptions):
    """``rlonce probe code``'s own flags."""

    interceptor: Literal["both", "on", "off"] = "both"
    """Run the routes with the action guard on, off (the grader alone) or both in turn."""
    no_interceptor: bool = False
    """The same as interceptor off."""


def build(o: PackOptions):
    from functools import partial

    from rlonce.envs.code.env import CodeEnv
    from rlonce.envs.code.expert import expert_turns
    from rlonce.envs.code.validate import validated_tasks
    from rlonce.envs.packs import pack_domain

    return pack_domain("code", o, validated_tasks, partial(CodeEnv, trust_validation=True), expert_turns)


def _system_python() -> bool:
    try:
        return subprocess.run(["/usr/bin/python3", "-c", "import sys; sys.exit(0)"], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def needs(o: PackOptions) -> list[Need]:
    from rlonce.envs.packs import need_pack

    py = _system_python()
    return [need_program("git", "git", "the code domain's workspaces"),
            Need("system python", py, "/usr/bin/python3 " + ("runs" if py else "missing") +
                 " (it runs the code domain's tests inside the sandbox)", "apt-get install -y python3"),
            need_pack(o.pack, "code")]


def _unnamed_pack(manifest: dict) -> bool:
    """A code pack written before pack.json named its domain: format 1 with pinned packages."""
    return manifest.get("format") == 1 and "packages" in manifest


def pack_audit():
    """What the offline grading tools need of a code pack (``rlonce.envs.code.pack_audit``)."""
    from rlonce.envs.code.pack_audit import PACK_AUDIT

    return PACK_AUDIT


DOMAIN = DomainSpec(
    name="code", build=build, options=PackOptions, has_expert=True, needs=needs, pack_audit=pack_audit,
    summary="repair a mutated function of a real package; graded by its tests (needs a pack)",
    packs=PackTools(build="rlonce.envs.code.build:build_command", build_settings=BuildSettings,
                    validate="rlonce.envs.code.validate:validate_command", recognises=_unnamed_pack),
    probe=Probe(run="rlonce.envs.code.probe:run_probe", format_report="rlonce.envs.code.probe:format_report",
                reads=("limit", "shard", "routes", "concurrency", "record"), settings=ProbeSettings))
