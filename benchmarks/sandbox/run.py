"""Sandbox and grading overhead, each next to the same work done without a sandbox, in one run.

    python benchmarks/sandbox/run.py --out DIR [--pack runs/packs/code] [--tasks 20]

* lifecycle: ``BwrapSandbox()`` + ``exec("true")`` + ``close()`` vs ``sh -c true`` in a subprocess;
* hardening: the same lifecycle, and one ``exec("true")`` in a live sandbox, vs the sandbox class
  as it was before the hardening of issue 15 (``--before REV``, read from git history: bwrap
  started as root with uid 1000 inside mapped to host root, no seccomp filter, no uid drop, no
  keyring, no size-capped mounts), measured interleaved in one run;
* restore: ``snapshot()``/``restore()`` of a code-task workspace vs copying the same tree with
  ``shutil.copytree``;
* grading: ``CodeEnv.grade`` of an untouched workspace (carried sources, fresh sandbox, the
  hidden tests through the testbed's launcher) vs running the same launcher command (same
  interpreter, testbed and report) on the same files directly on the host.

Each pair is measured interleaved; p50/p95 and the ratios (sandboxed / bare) go to
``results.json``, ``results.md`` and ``sandbox.png``. Needs a built task pack
(``rlonce tasks build code --out runs/packs/code``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def lifecycle(n: int) -> tuple[list[float], list[float]]:
    from rlonce.sandbox.bwrap import BwrapSandbox

    sb, bare = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        box = BwrapSandbox()
        asyncio.run(box.exec("true"))
        box.close()
        sb.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", "true"], check=True)
        bare.append(time.perf_counter() - t0)
    return sb, bare


BEFORE = "aef8867"
"""The last commit before the hardening of issue 15."""


def load_before(rev: str):
    """``rlonce.sandbox.bwrap`` as it was at ``rev`` (read from git history), as a module."""
    import importlib.util

    src = subprocess.run(["git", "show", f"{rev}:src/rlonce/sandbox/bwrap.py"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    path = Path(tempfile.mkdtemp()) / "bwrap_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("bwrap_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bwrap_before"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def hardening(n: int, rev: str) -> dict[str, tuple[list[float], list[float]]]:
    """Hardened vs pre-hardening sandbox class: whole lifecycle, and one exec in a live sandbox."""
    from rlonce.sandbox.bwrap import BwrapSandbox

    Before = load_before(rev).BwrapSandbox
    life, life_old, ex, ex_old = [], [], [], []
    live, live_old = BwrapSandbox(), Before()
    for _ in range(n):
        for cls, out in ((BwrapSandbox, life), (Before, life_old)):
            t0 = time.perf_counter()
            box = cls()
            asyncio.run(box.exec("true"))
            box.close()
            out.append(time.perf_counter() - t0)
        for box, out in ((live, ex), (live_old, ex_old)):
            t0 = time.perf_counter()
            asyncio.run(box.exec("true"))
            out.append(time.perf_counter() - t0)
    live.close()
    live_old.close()
    return {"hardening_lifecycle": (life, life_old), "hardening_exec": (ex, ex_old)}


def restore(tasks, n: int) -> tuple[list[float], list[float]]:
    from rlonce.envs.code.tasks import materialize
    from rlonce.sandbox.bwrap import BwrapSandbox

    sb, bare = [], []
    for k in range(n):
        t = tasks[k % len(tasks)]
        box = BwrapSandbox()
        materialize(t, box.workspace)
        sid = box.snapshot()
        t0 = time.perf_counter()
        box.restore(sid)
        sb.append(time.perf_counter() - t0)
        dest = Path(tempfile.mkdtemp()) / "copy"
        t0 = time.perf_counter()
        shutil.copytree(box.workspace, dest, symlinks=True)
        bare.append(time.perf_counter() - t0)
        shutil.rmtree(dest.parent)
        box.close()
    return sb, bare


def grading(tasks) -> tuple[list[float], list[float]]:
    from rlonce.core.records import Sequence
    from rlonce.envs.code.env import CodeEnv
    from rlonce.envs.code.packages import testbed
    from rlonce.envs.code.tasks import materialize
    from rlonce.envs.code.testbed import TESTBED_MOUNT, launcher_command, parse_report

    sb, bare = [], []
    for t in tasks:
        env = CodeEnv(t)
        asyncio.run(env.setup())
        t0 = time.perf_counter()
        asyncio.run(env.grade(Sequence(t.task_id, "bench")))
        sb.append(time.perf_counter() - t0)
        asyncio.run(env.cleanup())
        d = Path(tempfile.mkdtemp())
        materialize(t, d, hidden=True, git=False)
        tb = testbed(Path(t.pack_dir) / "cache")
        (d / "nonce").write_text("bench")
        argv = [a.replace(TESTBED_MOUNT, str(tb)) if a.startswith(TESTBED_MOUNT) else
                str(d) + a[len("/work"):] if a == "/work" or a.startswith("/work/") else a
                for a in shlex.split(launcher_command(t.spec, sorted(t.hidden_files), str(d / "nonce")))]
        t0 = time.perf_counter()  # the same interpreter, testbed and launcher, without bwrap
        out = subprocess.run(argv, cwd=d, env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}, capture_output=True,
                             text=True).stdout
        assert parse_report(out, "bench") is not None, out[-500:]
        bare.append(time.perf_counter() - t0)
        shutil.rmtree(d)
    return sb, bare


def main() -> None:
    ap = argparse.ArgumentParser(description="sandbox and grading overhead vs no sandbox")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pack", default="runs/packs/code")
    ap.add_argument("--tasks", type=int, default=20, help="tasks sampled for restore and grading")
    ap.add_argument("--repeats", type=int, default=30, help="sandbox lifecycles measured")
    ap.add_argument("--before", default=BEFORE, help="git revision of the pre-hardening sandbox to compare with")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from rlonce.envs.code.validate import validated_tasks

    tasks = validated_tasks(Path(args.pack))
    step = max(1, len(tasks) // args.tasks)
    tasks = tasks[::step][: args.tasks]
    rows = {}
    hard = hardening(args.repeats, args.before)
    for name, what, (sb, bare) in (
        ("lifecycle", "create + exec(true) + destroy vs sh -c true", lifecycle(args.repeats)),
        ("hardening_lifecycle", "create + exec(true) + destroy: hardened vs pre-hardening sandbox",
         hard["hardening_lifecycle"]),
        ("hardening_exec", "exec(true) in a live sandbox: hardened vs pre-hardening sandbox", hard["hardening_exec"]),
        ("restore", "workspace restore vs copytree of the same tree", restore(tasks, len(tasks))),
        ("grading", "grade one task (fresh sandbox) vs the same pytest on the host", grading(tasks)),
    ):
        rows[name] = {"what": what, "n": len(sb), "sandbox_p50_s": pct(sb, 0.5), "sandbox_p95_s": pct(sb, 0.95),
                      "bare_p50_s": pct(bare, 0.5), "bare_p95_s": pct(bare, 0.95),
                      "ratio_p50": pct(sb, 0.5) / pct(bare, 0.5), "ratio_p95": pct(sb, 0.95) / pct(bare, 0.95),
                      "mean_sandbox_s": statistics.mean(sb), "mean_bare_s": statistics.mean(bare)}
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    from rlonce.telemetry.bench import paired_bars, write_table

    table = write_table(out / "results.md", ["measurement", "n", "sandboxed p50 / p95 (s)",
                                             "bare (or pre-hardening) p50 / p95 (s)",
                                             "ratio p50", "ratio p95"],
                        [[r["what"], str(r["n"]), f"{r['sandbox_p50_s']:.3f} / {r['sandbox_p95_s']:.3f}",
                          f"{r['bare_p50_s']:.3f} / {r['bare_p95_s']:.3f}", f"{r['ratio_p50']:.2f}",
                          f"{r['ratio_p95']:.2f}"] for r in rows.values()])
    print(table)
    names = list(rows)
    paired_bars(out / "sandbox.png", names, {"sandboxed (p50)": [rows[n]["sandbox_p50_s"] for n in names],
                                             "bare (p50)": [rows[n]["bare_p50_s"] for n in names]},
                ylabel="seconds", title="Sandbox and grading overhead")

if __name__ == "__main__":
    main()
