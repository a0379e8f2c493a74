"""Restartable multi-arm experiments: the benchmarks whose arms are whole training runs, taking
hours, that a session starts and a later one finishes (``benchmarks/yoro_vs_specialists``,
``benchmarks/harness_transfer``).

The experiment's config is copied into its folder on the first run and every later run reads that
copy (another config for the same folder is refused). Each arm runs in a child process of its own;
an arm that is done is never run again, one that stopped part-way resumes (the arm's own rule), and
``DIR/arms.json`` records every session of every arm with its wall time and exit status."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path


def _text(path: Path) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"error: cannot read config {path}: {getattr(e, 'strerror', None) or e}") from None


def read_config(path: Path) -> dict:
    try:
        return tomllib.loads(_text(path))
    except tomllib.TOMLDecodeError as e:
        raise SystemExit(f"error: {path} is not valid TOML: {e}") from None


def recorded_config(out: Path, given: Path) -> Path:
    """The experiment's config, copied to ``out/config.toml`` on its first run: every arm (and every
    later session that resumes it) reads that copy. A different config for the same ``out`` is refused."""
    kept = out / "config.toml"
    text = _text(given)
    if kept.is_file() and kept.read_text() != text:
        raise SystemExit(f"error: {out} was started with another config (kept in {kept}); resume with "
                         f"--config {kept}, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    kept.write_text(text)
    return kept


def parser(doc: str, default_config: Path, arms_help: str) -> argparse.ArgumentParser:
    """The command line every restartable experiment takes: ``--out``, ``--config``, ``--arms``,
    ``--accept-changes``, ``--quiet`` and ``KEY=VALUE`` overrides (``--child ARM`` runs one arm)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", type=Path, default=default_config)
    ap.add_argument("--arms", default="", help=f"comma-separated arms (default: {arms_help})")
    ap.add_argument("--accept-changes", action="store_true",
                    help="resume an arm even though the code or config changed since it started")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return ap


def chosen_arms(given: str, every: list[str]) -> list[str]:
    """``--arms`` (comma-separated; empty: every arm, in order), refused with the known arms named
    when it names one that is not."""
    arms = [a for a in given.split(",") if a] or every
    if unknown := [a for a in arms if a not in every]:
        raise SystemExit(f"error: unknown arm(s) {', '.join(unknown)}; this config's arms: {', '.join(every)}")
    return arms


def run_state(run_dir: Path) -> str:
    """A training run's state: 'done' (its ``summary.json`` exists), 'resumable' (a checkpoint, no
    summary) or 'new'."""
    if (run_dir / "summary.json").is_file():
        return "done"
    if any((run_dir / "checkpoints").glob("step-*")):
        return "resumable"
    return "new"


def child_command(script: Path, args, arm: str) -> list[str]:
    """The command that runs ``arm`` of the experiment ``script`` in a child process, with the
    parent's ``--out``, ``--config``, ``--accept-changes``, ``--quiet`` and overrides."""
    return [sys.executable, str(Path(script).resolve()), "--out", str(args.out), "--config", str(args.config),
            "--child", arm, *(["--accept-changes"] if args.accept_changes else []),
            *(["--quiet"] if args.quiet else []), *args.overrides]


def drive(out: Path, arms: list[str], *, state: Callable[[str], str], launch: Callable[[str], int],
          write: Callable[[], object], waits: Callable[[str], str | None] = lambda arm: None) -> int:
    """Runs each arm of ``arms`` that is not 'done' (``state(arm)``) with ``launch(arm)`` (its exit
    status), in order; an arm that ``waits`` (a reason: another arm must finish first) is skipped
    with the reason said. After each arm its session goes to ``out/arms.json`` and ``write()``
    writes whatever has finished. The first arm that fails stops the run: its status is returned."""
    ledger_path = out / "arms.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.is_file() else {}
    for arm in arms:
        now = state(arm)
        if now == "done":
            print(f"{arm}: done (kept)")
            continue
        if why := waits(arm):
            print(f"{arm}: waits for {why}")
            continue
        print(f"{arm}: {'resuming' if now == 'resumable' else 'starting'}", flush=True)
        t0 = time.time()
        rc = launch(arm)
        entry = ledger.setdefault(arm, {"sessions": []})
        entry["sessions"].append({"started": t0, "seconds": time.time() - t0, "exit": rc})
        entry["state"] = state(arm)
        ledger_path.write_text(json.dumps(ledger, indent=2) + "\n")
        write()
        if rc != 0:
            print(f"{arm}: exited {rc}; rerun the same command to resume it")
            return rc
    return 0


def launch_child(script: Path, args) -> Callable[[str], int]:
    """``drive``'s ``launch``: the arm in a child process (``child_command``)."""
    return lambda arm: subprocess.run(child_command(script, args, arm)).returncode
