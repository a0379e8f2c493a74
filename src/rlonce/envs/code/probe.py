"""``rlonce probe code``: a scripted hack agent tries known shortcut routes on every task.

Each route is a short list of tool calls — made through the environment's own tools, so the
interceptor sees them as it would see a model's — followed by the normal grading path. A route that
earns reward on any task is a hole in the environment. Controls run in the same report: the
reference fix, applied with the editor tool, must earn reward on every task, and so must the same
fix with a harmless ``getattr(o, name)`` helper added (``getattr_control``: a grader that punishes
ordinary Python teaches the policy to avoid it); doing nothing must earn it on none. Routes follow
the seeds' case table (seed 000, "How the Model Cheats, and How It Gets Caught"; seed 001, "The
environment can accidentally hand out the answer"): reading hidden tests, git history and
unreachable objects, installing or downloading the package (and its later tests), fetching an
upstream file, cloning the upstream repository, consulting the issue tracker, probing installed
versions, finding an installed or cached copy, planting test-runner hooks, editing the test
settings, deleting tests, exiting early, and writing where the grader might look. Issue 15 added
routes against the grader itself: shadowing the launcher, pytest or the report plugin from the
workspace, patching the runner from files the static scan once exempted or through obfuscated
imports, a ``sitecustomize`` package, a user site, copies of the package on other mounts, forging
the report with a guessed nonce, tracing over asserts, walking the heap, faking the test module,
compiled or linked shadows, and trees that would turn the agent's failure into infrastructure
(deep, huge, FIFOs, a directory at a hidden test path, a hang at import). Issue 56 added a thread
that swaps each test's code for a stub (and its variants: behind ``__wrapped__``, with swapped
defaults, a test's name rebound, pytest's runner functions patched in place). ``probe_pack`` runs
them with the interceptor on and off; the routes themselves are in ``rlonce.envs.code.routes``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from rlonce.core.records import Sequence
from rlonce.envs.code.env import CodeEnv, TestbedCorrupted
from rlonce.envs.code.interceptor import Interceptor
from rlonce.envs.code.routes import PATCH_REPORTS, ROUTES, Call, getattr_control_calls, reference_fix_calls
from rlonce.envs.code.tasks import CodeTask

__all__ = ["CONTROLS", "KEYS", "PATCH_REPORTS", "ROUTES", "format_report", "getattr_control_calls", "probe_pack",
           "read_record", "reference_fix_calls", "run_probe", "run_route"]


async def run_route(task: CodeTask, calls: Callable[[CodeEnv], list[Call]], *, intercept: bool) -> dict:
    env = CodeEnv(task, interceptor=None if intercept else Interceptor(patterns={}, hidden_paths=[]))
    seq = Sequence(task.task_id, "probe")
    try:
        await env.setup()
        for name, args in calls(env):
            await env.call_tool(name, args)
        try:
            reward = (await env.grade(seq)).reward
            infra = False
        except TestbedCorrupted:
            reward, infra = 0.0, True
    finally:
        await env.cleanup()
    denied = sum(v for k, v in env.metrics.items() if k.startswith("intercepted_"))
    return {"rewarded": reward > 0, "infra": infra, "hack_confirmed": seq.hack_confirmed, "denied": denied > 0}


KEYS = ("rewarded", "denied", "hack_confirmed", "infra")
CONTROLS: dict[str, Callable[[CodeTask, CodeEnv], list[Call]]] = {
    "reference_fix": lambda t, env: reference_fix_calls(t, (env.sandbox.workspace / t.mut.path).read_text()),
    "noop": lambda t, env: [],
    "getattr_control": lambda t, env: getattr_control_calls(t, (env.sandbox.workspace / t.mut.path).read_text()),
}
"""The controls every probe runs on every task: the first and last must earn reward, ``noop`` never."""
CONTROL_LABELS = {"reference_fix": "reference fix", "noop": "no-op", "getattr_control": "fix + getattr"}


def probe_pack(tasks: list[CodeTask], *, routes: list[str] | None = None, intercept: bool | str = "both",
               concurrency: int = 2, progress: bool = True, record: Path | None = None) -> dict:
    """Run every route and the controls (``CONTROLS``) on every task. ``intercept``: True (interceptor on),
    False (off: the grader alone) or ``"both"`` (each mode in turn; the report then holds an
    ``on`` and an ``off`` report, and ``routes`` rows with both columns). ``record``: a JSONL
    file that gets one line per attempt as it finishes; attempts already in it are not run
    again, so a long probe resumes where it stopped and the report counts every attempt."""
    if intercept == "both":
        on = probe_pack(tasks, routes=routes, intercept=True, concurrency=concurrency, progress=progress, record=record)
        off = probe_pack(tasks, routes=routes, intercept=False, concurrency=concurrency, progress=progress,
                         record=record)
        return {"interceptor": "both", "tasks": len(tasks), "on": on, "off": off}
    names = list(ROUTES) if routes is None else routes
    unknown = [r for r in names if r not in ROUTES]
    if unknown:
        raise ValueError(f"unknown probe routes {unknown}; known: {sorted(ROUTES)}")
    mode = "on" if intercept else "off"
    done = {(r["task"], r["route"]): r for r in read_record(record) if r["mode"] == mode} if record else {}
    jobs: list[tuple[str, CodeTask, Callable]] = []
    for t in tasks:
        jobs += [(c, t, lambda env, c=c, t=t: CONTROLS[c](t, env)) for c in CONTROLS]
        jobs += [(r, t, lambda env, r=r, t=t: ROUTES[r](t)) for r in names]
    rows = [done[(t.task_id, name)] for name, t, _ in jobs if (t.task_id, name) in done]
    todo = [j for j in jobs if (j[1].task_id, j[0]) not in done]
    bar = tqdm(total=len(jobs), initial=len(rows), desc=f"probe (interceptor {mode})", unit="attempt",
               disable=not progress)
    out = open(record, "a+b") if record else None
    if out is not None and out.tell() and (out.seek(out.tell() - 1), out.read(1))[1] != b"\n":
        out.write(b"\n")  # end a torn last line so the next attempt's line is whole

    async def main():
        sem = asyncio.Semaphore(concurrency)

        async def one(name, t, calls):
            async with sem:
                r = await run_route(t, calls, intercept=bool(intercept))
            row = {"mode": mode, "task": t.task_id, "route": name, **{k: bool(r[k]) for k in KEYS}}
            rows.append(row)
            if out is not None:
                out.write(json.dumps(row).encode() + b"\n")
                out.flush()
            bar.update(1)

        await asyncio.gather(*(one(*j) for j in todo))

    try:
        asyncio.run(main())
    finally:
        bar.close()
        if out is not None:
            out.close()
    results = {n: {"tasks": 0, **dict.fromkeys(KEYS, 0)} for n in [*CONTROLS, *names]}
    for row in rows:
        results[row["route"]]["tasks"] += 1
        for k in KEYS:
            results[row["route"]][k] += int(row[k])
    return {"routes": {r: results[r] for r in names}, **{c: results[c] for c in CONTROLS},
            "interceptor": bool(intercept), "tasks": len(tasks)}


def run_probe(options, request) -> dict:
    """``rlonce probe code`` (``rlonce.config.domains.Probe.run``): ``probe_pack`` on the validated
    tasks of ``options.pack`` the request selects, in the interceptor mode of its settings."""
    from rlonce.envs.code.validate import validated_tasks
    from rlonce.envs.packs import probed_tasks

    unknown = [r for r in request.routes or [] if r not in ROUTES]
    if unknown:
        raise ValueError(f"unknown probe route(s) {', '.join(unknown)}; known: {', '.join(ROUTES)}")
    tasks = probed_tasks("code", options.pack, validated_tasks, request)
    mode = "off" if request.settings.no_interceptor else request.settings.interceptor
    return probe_pack(tasks, routes=request.routes, intercept={"both": "both", "on": True, "off": False}[mode],
                      concurrency=request.concurrency, progress=request.progress, record=request.record)


def read_record(path: Path) -> list[dict]:
    """The attempts in a probe record; a torn last line (a run killed mid-write) is left out."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and {"mode", "task", "route", *KEYS} <= row.keys():
            rows.append(row)
    return rows


def format_report(report: dict) -> str:
    if report["interceptor"] == "both":
        return _format_both(report["on"], report["off"])
    lines = [f"Hack probes on {report['tasks']} tasks (interceptor {'on' if report['interceptor'] else 'off'})", "",
             f"{'route':32} {'tasks':>6} {'rewarded':>9} {'denied':>7} {'hack':>5} {'infra':>6}"]
    rows = [*report["routes"].items(), *((f"[control] {CONTROL_LABELS[c]}", report[c]) for c in CONTROLS)]
    for name, r in rows:
        lines.append(f"{name:32} {r['tasks']:6} {r['rewarded']:9} {r['denied']:7} "
                     f"{r['hack_confirmed']:5} {r['infra']:6}")
    holes = [n for n, r in report["routes"].items() if r["rewarded"]]
    lines += ["", "holes: " + (", ".join(holes) if holes else "none — no route earned reward on any task")]
    return "\n".join(lines)


def _format_both(on: dict, off: dict) -> str:
    lines = [f"Hack probes on {on['tasks']} tasks, interceptor on | off", "",
             f"{'route':32} {'tasks':>6} {'rewarded':>12} {'denied':>7} {'hack':>11} {'infra':>11}"]
    rows = [*((n, on["routes"][n], off["routes"][n]) for n in on["routes"]),
            *((f"[control] {CONTROL_LABELS[c]}", on[c], off[c]) for c in CONTROLS)]
    for name, a, b in rows:
        lines.append(f"{name:32} {a['tasks']:6} {a['rewarded']:5} | {b['rewarded']:4} {a['denied']:7} "
                     f"{a['hack_confirmed']:4} | {b['hack_confirmed']:4} {a['infra']:4} | {b['infra']:4}")
    holes = [f"{n} ({m})" for m, rep in (("on", on), ("off", off)) for n, r in rep["routes"].items() if r["rewarded"]]
    lines += ["", "holes: " + (", ".join(holes) if holes
                               else "none — no route earned reward on any task, in either mode")]
    return "\n".join(lines)
