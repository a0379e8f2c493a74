"""Outside agents as held-out harnesses: any command that takes a base URL and an API key.

``run_outside`` sets up the task's environment, opens a gateway session for the sequence, and
runs the command in a bubblewrap sandbox over the task's workspace (mounted at ``/work``,
the network namespace shared so the agent reaches the gateway on loopback). The command
gets, as environment variables:

    OPENAI_BASE_URL     http://127.0.0.1:PORT/sessions/ID/v1   (Chat Completions, Responses)
    ANTHROPIC_BASE_URL  http://127.0.0.1:PORT/sessions/ID      (Messages)
    OPENAI_API_KEY / ANTHROPIC_API_KEY   ID   (the key also names the session)
    RLONCE_MODEL        the served model name
    RLONCE_TASK         the task: the environment's instructions and question
    RLONCE_ANSWER_FILE  where to write the final answer (no file: no submission)

Its answer is graded by the environment like any built-in arm's. A command that fails before
the model was ever asked is an infrastructure failure, never a low score.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import rlonce
from rlonce.core.records import FailureCategory, Sequence, Status
from rlonce.envs.base import grade_or_infra
from rlonce.gateway.core import Gateway
from rlonce.gateway.session import session_metrics
from rlonce.sandbox.base import SandboxError
from rlonce.sandbox.bwrap import WORKDIR, BwrapSandbox, Limits

ANSWER = ".rlonce-answer"


def _python_binds() -> tuple[dict[str, str], str, str]:
    """Read-only mounts that let the agent command run this Python environment (an agent such
    as mini-swe-agent is installed in it): the virtual environment and rlonce's sources under
    ``/opt/rlonce`` (the sandbox's own ``/work`` and ``/tmp`` would hide them at their host
    paths), the base interpreter where the environment expects it. Returns (host → sandbox
    mounts, venv path, source path)."""
    base = os.path.realpath(sys.base_prefix)
    if any(base == p or base.startswith(p + "/") for p in (WORKDIR, "/tmp")):
        raise SandboxError(f"the Python installation at {base} lies under {WORKDIR} or /tmp, which the sandbox "
                           "replaces; use an interpreter installed elsewhere to run outside harnesses")
    src = str(Path(rlonce.__file__).resolve().parents[1])
    return {sys.prefix: "/opt/rlonce/venv", base: base, src: "/opt/rlonce/src"}, "/opt/rlonce/venv", "/opt/rlonce/src"


def outside_limits(timeout: float) -> Limits:
    return Limits(cpu_seconds=int(timeout), wall_seconds=timeout, address_space_mb=8192, processes=256,
                  output_bytes=1 << 20)


async def run_outside(task, env_factory, gateway: Gateway, base_url: str, command: str, *, name: str = "outside",
                      timeout: float = 300.0) -> Sequence:
    t0 = time.perf_counter()
    env = env_factory(task)
    session = gateway.open(metadata={"task_id": task.task_id, "arm": name})
    status, failure, answer, reward = Status.SUBMITTED, None, None, None
    result = None
    try:
        try:
            await env.setup()
        except Exception:  # noqa: BLE001 - the retry boundary
            status, failure = Status.INFRA, FailureCategory.SETUP_FAILED
        else:
            binds, venv, src = _python_binds()
            sbx = BwrapSandbox(outside_limits(timeout), ro_binds=binds, share_net=True, workspace=env.sandbox.workspace,
                               env={"OPENAI_BASE_URL": f"{base_url}/sessions/{session.id}/v1",
                                    "ANTHROPIC_BASE_URL": f"{base_url}/sessions/{session.id}",
                                    "OPENAI_API_KEY": session.id, "ANTHROPIC_API_KEY": session.id,
                                    "RLONCE_MODEL": gateway.model_name,
                                    "RLONCE_TASK": f"{env.system_prompt()}\n\n{env.user_prompt()}",
                                    "RLONCE_ANSWER_FILE": f"{WORKDIR}/{ANSWER}",
                                    "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": src})
            try:
                result = await sbx.exec(command)
            finally:
                sbx.close()
            answer_path = env.sandbox.workspace / ANSWER
            if answer_path.is_file():
                answer = answer_path.read_text(errors="replace").strip()
                answer_path.unlink()
            if answer is None:
                if not session.generations:
                    status, failure = Status.INFRA, FailureCategory.HARNESS_ERROR
                else:
                    status = Status.LIMITS
        seq = Sequence(task.task_id, name, session.contexts, status, failure, answer=answer,
                       turns=len(session.generations))
        if status is not Status.INFRA:
            reward = await grade_or_infra(env, seq)
    finally:
        await env.cleanup()
    seq.reward = reward
    session.reward = reward
    seq.metrics = {**session_metrics(session), "seconds": time.perf_counter() - t0,
                   "model_tokens": float(session.model_tokens()),
                   "exit_code": float(result.exit_code) if result else -1.0}
    if result is not None:
        session.metadata["harness_output_tail"] = result.output[-2000:]
    return seq
