"""cyber: reproduce a vulnerability of a sanitizer-built C target with a proof-of-concept input."""

from pydantic import Field, model_validator

from rlonce.config.domains import DomainOptions, DomainSpec, Need, PackTools, Probe, need_program
from rlonce.envs.packs import PackOptions


class BuildSettings(DomainOptions):
    """``rlonce tasks build cyber``'s flags."""

    targets: str | None = None
    """Comma-separated subset of the shipped targets (default: all; 'none': only generated ones)."""
    generated: int = Field(32, ge=0, le=128)
    """Also generate this many seeded record-parser targets, 8 bugs each (0: the shipped six alone)."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seed of the generated targets."""
    handlers: int = Field(8, ge=1, le=12)
    """Difficulty: record handlers (each with its planted bug) per generated target. Fewer is less
    C to read before the named function; the easy tier is 2."""

    @model_validator(mode="after")
    def _shipped(self):
        from rlonce.envs.cyber.build import target_names

        names = [] if self.targets in (None, "none") else self.targets.split(",")
        unknown = [n for n in names if n not in target_names()]
        if unknown:
            raise ValueError(f"unknown target(s) {', '.join(unknown)}; shipped targets: {', '.join(target_names())}")
        if self.targets == "none" and not self.generated:
            raise ValueError("--targets none builds nothing; add --generated N")
        return self


def build(o: PackOptions):
    from rlonce.envs.cyber.env import CyberEnv
    from rlonce.envs.cyber.expert import expert_turns
    from rlonce.envs.cyber.validate import validated_tasks
    from rlonce.envs.packs import pack_domain

    return pack_domain("cyber", o, validated_tasks, CyberEnv, expert_turns)


def needs(o: PackOptions) -> list[Need]:
    from rlonce.envs.packs import need_pack

    return [need_program("clang", "clang", "the cyber targets' sanitizer builds"), need_pack(o.pack, "cyber")]


DOMAIN = DomainSpec(
    name="cyber", build=build, options=PackOptions, has_expert=True, needs=needs,
    summary="reproduce a C target's bug with an input its sanitizer catches (needs clang and a pack)",
    packs=PackTools(build="rlonce.envs.cyber.build:build_command", build_settings=BuildSettings,
                    validate="rlonce.envs.cyber.validate:validate_command"),
    probe=Probe(run="rlonce.envs.cyber.probe:run_probe", format_report="rlonce.envs.cyber.probe:format_report",
                reads=("limit", "shard", "routes", "concurrency")))
