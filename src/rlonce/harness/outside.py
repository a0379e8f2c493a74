"""Outside agents as held-out harnesses: any command that takes a base URL and an API key.

``run_outside`` sets up the task's environment, opens a gateway session for the sequence, and
runs the command in a bubblewrap sandbox over the task's workspace (mounted at ``/work``). The
sandbox has no network of its own: the gateway is reached through a Unix socket bound in from
the host and relayed to ``127.0.0.1:8080`` inside (``rlonce.sandbox.relay``), so the agent
reaches the gateway and nothing else — no internet, no other loopback service. Of rlonce it sees
only what a harness needs: the virtual environment's packages (the agent CLI installed there),
and a package tree holding just ``rlonce.harness.mswea`` (the mini-swe-agent glue), never the
rest of rlonce's sources. The command gets, as environment variables:

    OPENAI_BASE_URL     http://127.0.0.1:8080/sessions/ID/v1   (Chat Completions, Responses)
    ANTHROPIC_BASE_URL  http://127.0.0.1:8080/sessions/ID      (Messages)
    OPENAI_API_KEY / ANTHROPIC_API_KEY   the session's secret key (no other key reaches it)
    RLONCE_MODEL        the served model name
    RLONCE_TASK         the task: the environment's instructions and question
    RLONCE_ANSWER_FILE  where to write the final answer (no file: no submission)

Its answer is graded by the environment like any built-in arm's. A command that fails before
the model was ever asked is an infrastructure failure, never a low score. So is a sequence that
outlives one of its wall-clock limits (``rlonce.core.timeouts``): the agent is stopped once it
has sent no model request for ``agent_idle`` seconds (``agent_idle_timeout``), and a model
request the gateway gave up on (a 504 to the agent) makes the sequence ``model_timeout``
whatever the agent did next.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import rlonce
from rlonce.core.records import FailureCategory, Sequence, Status
from rlonce.core.timeouts import Expired, Timeouts
from rlonce.envs.base import grade_or_infra, infra_failure
from rlonce.errors import cause_of
from rlonce.gateway.core import Gateway
from rlonce.gateway.session import session_metrics
from rlonce.sandbox import hostfs, relay
from rlonce.sandbox.base import SandboxError
from rlonce.sandbox.bwrap import WORKDIR, BwrapSandbox, Limits

ANSWER = ".rlonce-answer"
PORT = 8080
"""Where the gateway answers inside the sandbox (its own loopback)."""
HARNESS_FILES = ("harness/mswea.py",)
"""The only rlonce modules an outside harness sees (under an otherwise empty ``rlonce`` package)."""


def _stage_harness_tree(stage: Path) -> None:
    """A package tree with only the harness glue, and the relay, for ``/opt/rlonce/src``."""
    src = Path(rlonce.__file__).resolve().parent
    (stage / "rlonce" / "harness").mkdir(mode=0o755, parents=True)
    for rel in ("__init__.py", "harness/__init__.py"):
        (stage / "rlonce" / rel).touch()
    for rel in HARNESS_FILES:
        shutil.copyfile(src / rel, stage / "rlonce" / rel)
    shutil.copyfile(relay.__file__, stage / "relay.py")
    for d in (stage, stage / "rlonce"):
        d.chmod(0o755)


def _python_binds(stage: Path, sockets: Path) -> tuple[dict[str, str], list[str]]:
    """Read-only mounts that let the agent command run this Python environment (an agent such
    as mini-swe-agent is installed in it): the virtual environment under ``/opt/rlonce/venv``
    (the sandbox's own ``/work`` and ``/tmp`` would hide it at its host path), the base
    interpreter where the environment expects it, the staged harness tree and the gateway's
    socket directory. Also returns paths to hide: rlonce itself, if installed into the venv."""
    base = os.path.realpath(sys.base_prefix)
    if any(base == p or base.startswith(p + "/") for p in (WORKDIR, "/tmp")):
        raise SandboxError(f"the Python installation at {base} lies under {WORKDIR} or /tmp, which the sandbox "
                           "replaces; use an interpreter installed elsewhere to run outside harnesses")
    binds = {sys.prefix: "/opt/rlonce/venv", base: base, str(stage): "/opt/rlonce/src", str(sockets): "/run/rlonce"}
    pkg = Path(rlonce.__file__).resolve().parent
    hide = []
    if pkg.is_relative_to(Path(sys.prefix).resolve()):  # a regular (non-editable) install
        hide.append("/opt/rlonce/venv/" + pkg.relative_to(Path(sys.prefix).resolve()).as_posix())
    return binds, hide


def outside_limits(timeout: float) -> Limits:
    return Limits(cpu_seconds=int(timeout), wall_seconds=timeout, address_space_mb=8192, processes=256,
                  output_bytes=1 << 20)


async def run_outside(task, env_factory, gateway: Gateway, base_url: str, command: str, *, name: str = "outside",
                      timeout: float = 300.0, timeouts: Timeouts | None = None) -> Sequence:
    """One sequence of ``command``; ``timeout`` is the command's own wall-clock limit (past it the
    sequence is truncated), ``timeouts`` the sequence's layered limits (default: ``Timeouts()``)."""
    t0, clock = time.perf_counter(), (timeouts or Timeouts()).start()
    env = env_factory(task)
    session = gateway.open(metadata={"task_id": task.task_id, "arm": name})
    status, failure, answer, grade, cause = Status.SUBMITTED, None, None, None, None
    result = None
    try:
        try:
            await clock.setup(env.setup())
        except Exception as e:  # noqa: BLE001 - the retry boundary
            status, (failure, cause) = Status.INFRA, infra_failure(e, FailureCategory.SETUP_FAILED)
        else:
            try:
                result = await clock.agent(_run_in_sandbox(env, session.id, session.key, gateway.settings.model_name,
                                                           base_url, command, timeout), session.last_request)
            except Expired as e:
                status, (failure, cause) = Status.INFRA, infra_failure(e, e.category)
            else:
                status, failure, answer, cause = _outcome(env, session)
        seq = Sequence(task.task_id, name, session.contexts, status, failure, answer=answer,
                       turns=len(session.generations), cause=cause)
        if status is not Status.INFRA:
            grade = await grade_or_infra(env, seq, clock)
    finally:
        await env.cleanup()
    seq.set_grade(grade)
    session.reward = seq.reward
    seq.metrics = {**session_metrics(session), "seconds": time.perf_counter() - t0,
                   "model_tokens": float(session.model_tokens()),
                   "exit_code": float(result.exit_code) if result else -1.0}
    if result is not None:
        session.metadata["harness_output_tail"] = result.output[-2000:]
    return seq


def _outcome(env, session) -> tuple[Status, FailureCategory | None, str | None, str | None]:
    """How the agent's run ended (status, failure, answer, cause): its answer file, and whether
    the gateway gave up on a request."""
    try:
        answer = env.sandbox.get_file(ANSWER, max_bytes=1 << 16).decode(errors="replace").strip()
    except (FileNotFoundError, hostfs.HostileFile):
        answer = None
    else:
        hostfs.remove_tree(env.sandbox.workspace / ANSWER)
    expired = next((e for e in session.events if e["kind"] == "model_timeout"), None)
    if expired is not None:
        return Status.INFRA, FailureCategory.MODEL_TIMEOUT, None, cause_of(
            Expired(FailureCategory.MODEL_TIMEOUT, expired["seconds"]))
    if answer is None:
        if not session.generations:
            return Status.INFRA, FailureCategory.HARNESS_ERROR, None, None
        return Status.LIMITS, None, None, None
    return Status.SUBMITTED, None, answer, None


async def _run_in_sandbox(env, sid: str, key: str, model: str, base_url: str, command: str, timeout: float):
    """Run ``command`` over ``env``'s workspace with the gateway at ``base_url`` relayed in."""
    scratch = Path(tempfile.mkdtemp(prefix="rlonce-outside-"))
    scratch.chmod(0o755)
    stage, sockets = scratch / "src", scratch / "run"
    sockets.mkdir(mode=0o755)
    _stage_harness_tree(stage)
    url = urlsplit(base_url)
    server = await relay.unix_to_tcp(str(sockets / "gateway.sock"), url.hostname, url.port)
    try:
        binds, hide = _python_binds(stage, sockets)
        inside = f"http://127.0.0.1:{PORT}/sessions/{sid}"
        sbx = BwrapSandbox(outside_limits(timeout), ro_binds=binds, hide=hide, workspace=env.sandbox.workspace,
                           uid=env.sandbox.uid,
                           env={"OPENAI_BASE_URL": f"{inside}/v1", "ANTHROPIC_BASE_URL": inside,
                                "OPENAI_API_KEY": key, "ANTHROPIC_API_KEY": key, "RLONCE_MODEL": model,
                                "RLONCE_TASK": f"{env.system_prompt()}\n\n{env.user_prompt()}",
                                "RLONCE_ANSWER_FILE": f"{WORKDIR}/{ANSWER}",
                                "PATH": "/opt/rlonce/venv/bin:/usr/local/bin:/usr/bin:/bin",
                                "PYTHONPATH": "/opt/rlonce/src"})
        try:
            return await sbx.exec(f"/usr/bin/python3 /opt/rlonce/src/relay.py {PORT} /run/rlonce/gateway.sock && "
                                  f"{command}")
        finally:
            sbx.close()
    finally:
        server.close()
        await server.wait_closed()
        hostfs.remove_tree(scratch)
