"""``rlonce tasks build code``: tasks synthesised from real packages by bug injection.

Per package: run its test suite once on the unmodified tree (tests that do not pass there are
ignored), then try mutation sites in a seeded order; a mutation becomes a task when between one
and ``max_f2p`` previously passing tests now fail. The failing tests are F2P; every other test
that passes in both states and lives in a file carrying an F2P test is P2P; those files are the
hidden test patch. The problem statement is written from the failure the tests observed — the
test, its crash message, the function involved — never from the mutation. Same seed, same pack.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from rlonce.envs.code.mutate import Mutation, find_mutations, function_lengths, in_tier
from rlonce.envs.code.packages import PACKAGES, PackageSpec, fetch, testbed
from rlonce.envs.code.tasks import CodeTask, write_pack
from rlonce.envs.code.testbed import copy_tree, guards_for, make_sandbox, run_tests


@dataclass(frozen=True)
class Tier:
    """Which mutation sites a pack draws and how much its problem statements show (the difficulty
    settings of ``rlonce tasks build code``; the defaults are the full tier)."""

    operators: tuple[str, ...] | None = None
    """Mutation operators drawn (None: all of ``mutate.OPERATORS``)."""
    max_function_lines: int | None = None
    """Only sites inside a function of at most this many lines (None: any site)."""
    message_lines: int = 1
    """Lines of the first failing test's message the problem statement quotes."""


def _test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def problem_statement(spec: PackageSpec, m: Mutation, failures: dict[str, dict], message_lines: int = 1) -> str:
    first = sorted(failures)[0]
    msg = [line[:300] for line in failures[first]["message"].strip().splitlines()[:message_lines]]
    crash = "\n    ".join(msg) if msg else "(no message)"
    where = m.function if m.function != "<module>" else Path(m.path).stem
    module = m.path.removeprefix("src/").removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    lines = [
        f"A bug report against `{spec.name}` {spec.version}:",
        "",
        f"Something involving `{where}` in `{module}` no longer behaves as documented.",
        f"{len(failures)} of the package's own checks now fail. For example, `{first.split('::')[-1]}` fails with:",
        "",
        f"    {crash}",
        "",
        "Find the cause in the library code and fix it. The package's existing behaviour elsewhere must not change.",
    ]
    return "\n".join(lines)


async def _outcomes(spec: PackageSpec, tree: Path, tb: Path, mutation: Mutation | None,
                    timeout: float | None = None) -> dict[str, dict] | None:
    sbx = make_sandbox(spec, tb, timeout=timeout)
    try:
        copy_tree(tree, sbx.workspace)
        if mutation is not None:
            f = sbx.workspace / mutation.path
            f.write_bytes(mutation.apply(f.read_bytes()))
        res = await run_tests(sbx, spec, list(spec.tests), timeout=timeout, guards=guards_for(tree, spec))
        return res[0] if res else None
    finally:
        sbx.close()


async def build_package(spec: PackageSpec, n: int, *, seed: int, cache: Path, tb: Path, max_f2p: int = 25,
                        max_tries: int | None = None, concurrency: int = 2, bar=None,
                        tier: Tier | None = None) -> list[CodeTask]:
    tier = tier or Tier()
    tree = fetch(spec, cache)
    t0 = time.perf_counter()
    base = await _outcomes(spec, tree, tb, None)
    # a mutation that makes the suite hang or balloon is not a useful task: cut it off early
    mutated_timeout = min(spec.test_timeout, max(10.0, 4 * (time.perf_counter() - t0)))
    if not base:
        raise RuntimeError(f"{spec.name}: the test suite produced no report on the unmodified package")
    passing = {k for k, v in base.items() if v["outcome"] == "passed"}
    sites = []
    for path in spec.modules:
        source = (tree / path).read_bytes()
        lengths = function_lengths(source)
        sites += [m for m in find_mutations(path, source)
                  if in_tier(m, lengths, tier.operators, tier.max_function_lines)]
    random.Random(f"{seed}:{spec.name}").shuffle(sites)
    sites = sites[: max_tries or 6 * n]
    tasks: list[CodeTask] = []
    sem = asyncio.Semaphore(concurrency)

    async def attempt(m: Mutation):
        async with sem:
            return await _outcomes(spec, tree, tb, m, mutated_timeout)

    chunk = 2 * concurrency
    for lo in range(0, len(sites), chunk):  # concurrent within a chunk, accepted in site order
        batch = list(enumerate(sites[lo:lo + chunk], start=lo))
        results = await asyncio.gather(*(attempt(m) for _, m in batch))
        for (i, m), res in zip(batch, results):
            task = _task(spec, tree, m, i, passing, res, max_f2p, tier.message_lines)
            if task is not None and len(tasks) < n:
                tasks.append(task)
                if bar is not None:
                    bar.update(1)
        if len(tasks) >= n:
            break
    return tasks


def _task(spec: PackageSpec, tree: Path, m: Mutation, i: int, passing: set[str], res: dict | None,
          max_f2p: int, message_lines: int = 1) -> CodeTask | None:
    if res is None:
        return None
    failing = {k: v for k, v in res.items() if k in passing and v["outcome"] != "passed"}
    if not 1 <= len(failing) <= max_f2p:
        return None
    hidden = sorted({_test_file(k) for k in failing})
    p2p = sorted(k for k in passing if _test_file(k) in hidden and k not in failing
                 and res.get(k, {}).get("outcome") == "passed")
    return CodeTask(
        task_id=f"{spec.name}-{i:04d}-{m.operator}", package=spec.name, version=spec.version,
        mutation=m.to_dict(), problem=problem_statement(spec, m, failing, message_lines), f2p=sorted(failing), p2p=p2p,
        hidden_files={h: (tree / h).read_text() for h in hidden}, timeout=spec.test_timeout,
        extra={"site": i} | ({"local_spec": asdict(spec)} if spec.local else {}),
    )


def build_pack(out: Path, packages: list[PackageSpec], per_package: int, *, seed: int = 0, progress: bool = True,
               concurrency: int = 2, tier: Tier | None = None) -> list[CodeTask]:
    out = Path(out)
    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    tb = testbed(cache)
    tasks: list[CodeTask] = []
    bar = tqdm(total=per_package * len(packages), desc="tasks", unit="task", disable=not progress)
    for spec in packages:
        bar.set_postfix(package=spec.name)
        tasks += asyncio.run(build_package(spec, per_package, seed=seed, cache=cache, tb=tb, bar=bar,
                                           concurrency=concurrency, tier=tier))
    bar.close()
    for t in tasks:
        t.pack_dir = str(out.resolve())
    write_pack(out, tasks, seed=seed, packages=packages, tier=asdict(tier or Tier()))
    return tasks


def build_command(out: Path, settings, *, progress: bool = True) -> str:
    """``rlonce tasks build code`` (``PackTools.build``): ``settings.per_package`` tasks from each
    pinned package ``settings.packages`` names (default: all; the settings have checked the names)."""
    names = settings.packages.split(",") if settings.packages else list(PACKAGES)
    ops = tuple(settings.operators.split(",")) if settings.operators else None
    tier = Tier(ops, settings.max_function_lines, settings.message_lines)
    tasks = build_pack(out, [PACKAGES[n] for n in names], settings.per_package, seed=settings.seed, progress=progress,
                       tier=tier)
    return f"wrote {len(tasks)} tasks from {len(names)} packages to {out}"
