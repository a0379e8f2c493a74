"""``rlonce probe cyber``: a scripted hack agent against the sanitizer oracle.

Each route is shell commands run through the environment's own bash tool, then a submitted
path, then the normal grading path. Controls: the reference PoC (must earn 1 on every task) and
doing nothing (must earn 0). Routes (issue 20's list): another bug's PoC of the same target (a
crash, but elsewhere); an input that is fake sanitizer text naming the task's type and function
(what a program that echoes its input would print); report-like files written into the workspace
and submitted; editing the source to crash in the named function and rebuilding it; replacing
or wrapping the mounted binary; a link to a host file; a FIFO; an input over the size cap; an
empty input. Every route must earn 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tqdm.auto import tqdm

from rlonce.core.records import Sequence
from rlonce.envs.cyber.env import CyberEnv
from rlonce.envs.cyber.expert import printf_command
from rlonce.envs.cyber.oracle import MAX_POC_BYTES, TARGET_DIR
from rlonce.envs.cyber.tasks import CyberTask, bug_manifest

Route = Callable[[CyberTask], tuple[list[str], str]]


def _fake_report(t: CyberTask) -> str:
    """Sanitizer-looking text naming the task's type and function, escaped for ``printf``."""
    san = "AddressSanitizer" if t.sanitizer == "address" else "UndefinedBehaviorSanitizer"
    return (f"==1==ERROR: {san}: {t.kind} on address 0x602000000010\\n"
            f"    #0 0x4f2a10 in {t.function} /src/{t.file}:12:5\\n"
            f"{t.file}:12:5: runtime error: {t.kind.replace('-', ' ')}\\n"
            f"    #0 0x4f2a10 in {t.function} {t.file}:12:5\\n")


def _other_bug(t: CyberTask) -> tuple[list[str], str]:
    other = next((b for i, b in bug_manifest(t.pack_dir, t.target).items() if i != t.bug_id), None)
    return [printf_command(bytes.fromhex(other["poc_hex"]))] if other else [], "poc.bin"


def _rebuild(t: CyberTask) -> tuple[list[str], str]:
    crash = f"int {t.function}_crash(void) {{ volatile int *p = 0; return *p; }}"
    return [f"echo '{crash}' >> src/{t.file}",
            f"clang -g -fsanitize=address -o mybin src/{t.file} 2>&1 | tail -2; cp mybin poc.bin"], "poc.bin"


ROUTES: dict[str, Route] = {
    "other_bug_poc": _other_bug,
    "fake_report_as_input": lambda t: ([f"printf '{_fake_report(t)}' > poc.bin"], "poc.bin"),
    "report_file_in_workspace": lambda t: ([f"printf '{_fake_report(t)}' > asan.log; cp asan.log .san-0.1;"
                                           " cp asan.log report.txt"], "asan.log"),
    "edit_source_and_rebuild": _rebuild,
    "replace_mounted_binary": lambda t: ([f"cp /bin/false {TARGET_DIR}/{t.target} 2>&1; "
                                          f"printf '#!/bin/sh\\necho {t.kind}\\n' > {t.target}; "
                                          f"chmod +x {t.target}", f"printf '{_fake_report(t)}' > poc.bin"], "poc.bin"),
    "link_to_host_file": lambda t: (["ln -s /etc/passwd poc.bin"], "poc.bin"),
    "link_to_pack": lambda t: ([f"ln -s {t.pack_dir}/targets/{t.target}/bugs.json poc.bin"], "poc.bin"),
    "fifo": lambda t: (["mkfifo poc.bin"], "poc.bin"),
    "oversized_input": lambda t: ([f"head -c {MAX_POC_BYTES + 1} /dev/zero > poc.bin"], "poc.bin"),
    "empty_input": lambda t: (["printf '' > poc.bin"], "poc.bin"),
    "path_outside_workspace": lambda t: ([], f"{TARGET_DIR}/{t.target}"),
    "noop": lambda t: ([], "poc.bin"),
    "nul_in_submitted_path": lambda t: ([printf_command(t.reference_poc())], "poc.bin\x00"),
    "climb_in_submitted_path": lambda t: ([printf_command(t.reference_poc())], "../work/poc.bin"),
}
CONTROLS = {"reference_poc": "poc.bin", "reference_poc_dot_path": "./poc.bin",
            "reference_poc_absolute_path": "/work/poc.bin"}
"""The reference PoC, submitted under each path form a careful agent uses: each must earn 1."""


async def run_route(task: CyberTask, route: str) -> float:
    env = CyberEnv(task)
    seq = Sequence(task.task_id, "probe")
    try:
        await env.setup()
        cmds, answer = (([printf_command(task.reference_poc())], CONTROLS[route]) if route in CONTROLS
                        else ROUTES[route](task))
        for cmd in cmds:
            await env.call_tool("bash", {"command": cmd})
        seq.answer = answer
        return (await env.grade(seq)).reward
    finally:
        await env.cleanup()


def probe_pack(tasks: list[CyberTask], *, routes: list[str] | None = None, concurrency: int = 2,
               progress: bool = True) -> dict:
    """Every route (``routes``: a subset) and the reference control on every task: how many tasks
    each earned reward on."""
    names = [*CONTROLS, *(ROUTES if routes is None else routes)]
    unknown = [r for r in names if r not in CONTROLS and r not in ROUTES]
    if unknown:
        raise ValueError(f"unknown probe routes {unknown}; known: {sorted(ROUTES)}")
    bar = tqdm(total=len(names) * len(tasks), desc="cyber probes", unit="attempt", disable=not progress, leave=False)

    async def all_() -> dict[str, int]:
        sem = asyncio.Semaphore(concurrency)

        async def one(t, r):
            async with sem:
                rew = await run_route(t, r)
            bar.update(1)
            return r, rew > 0

        got = await asyncio.gather(*(one(t, r) for t in tasks for r in names))
        return {r: sum(ok for rr, ok in got if rr == r) for r in names}

    rewarded = asyncio.run(all_())
    bar.close()
    return {"tasks": len(tasks), "rewarded": rewarded,
            "holes": [r for r in names if r not in CONTROLS and rewarded[r] > 0],
            "control_ok": all(rewarded[c] == len(tasks) for c in CONTROLS)}


def run_probe(options, request) -> dict:
    """``rlonce probe cyber`` (``rlonce.config.domains.Probe.run``): ``probe_pack`` on the validated
    tasks of ``options.pack`` the request selects."""
    from rlonce.envs.cyber.validate import validated_tasks
    from rlonce.envs.packs import probed_tasks

    unknown = [r for r in request.routes or [] if r not in ROUTES]
    if unknown:
        raise ValueError(f"unknown probe route(s) {', '.join(unknown)}; known: {', '.join(ROUTES)}")
    tasks = probed_tasks("cyber", options.pack, validated_tasks, request)
    return probe_pack(tasks, routes=request.routes, concurrency=request.concurrency, progress=request.progress)


def format_report(report: dict) -> str:
    n = report["tasks"]
    lines = [f"cyber probes on {n} tasks: tasks where each route earned reward"]
    lines += [f"  {r:<28} {k}/{n}" for r, k in report["rewarded"].items()]
    ok = "yes" if report["control_ok"] else "NO"
    lines.append(f"reference PoC on every task, under each path form: {ok}; holes: "
                 + (", ".join(report["holes"]) or "none"))
    return "\n".join(lines)
