"""code: repair a real package's mutated function in a sandboxed checkout, graded by its tests."""

import subprocess

from rlonce.config.domains import DomainSpec, Need, need_program
from rlonce.envs.packs import PackOptions


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


def pack_audit():
    """What the offline grading tools need of a code pack (``rlonce.envs.code.pack_audit``)."""
    from rlonce.envs.code.pack_audit import PACK_AUDIT

    return PACK_AUDIT


DOMAIN = DomainSpec(name="code", build=build, options=PackOptions, has_expert=True, needs=needs, pack_audit=pack_audit,
                    summary="repair a mutated function of a real package; graded by its tests (needs a pack)")
