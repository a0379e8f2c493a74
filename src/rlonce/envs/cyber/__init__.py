"""cyber: reproduce a vulnerability of a sanitizer-built C target with a proof-of-concept input."""

from rlonce.config.domains import DomainSpec, Need, need_program
from rlonce.envs.packs import PackOptions


def build(o: PackOptions):
    from rlonce.envs.cyber.env import CyberEnv
    from rlonce.envs.cyber.expert import expert_turns
    from rlonce.envs.cyber.validate import validated_tasks
    from rlonce.envs.packs import pack_domain

    return pack_domain("cyber", o, validated_tasks, CyberEnv, expert_turns)


def needs(o: PackOptions) -> list[Need]:
    from rlonce.envs.packs import need_pack

    return [need_program("clang", "clang", "the cyber targets' sanitizer builds"), need_pack(o.pack, "cyber")]


DOMAIN = DomainSpec(name="cyber", build=build, options=PackOptions, has_expert=True, needs=needs,
                    summary="reproduce a C target's bug with an input its sanitizer catches (needs clang and a pack)")
