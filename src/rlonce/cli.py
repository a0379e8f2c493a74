"""``rlonce`` console script. Arguments are parsed before any heavy library is imported.

Verbs:
  quickstart  train the embedded agent with the embedded defaults (SFT, then GRPO) on CPU
  train       the same job from a TOML config and/or key=value overrides; --resume RUN_DIR
  eval        held-out success of a model folder on the embedded domain
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


class UsageError(Exception):
    pass


def _writable_dir(path: str) -> Path:
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".rlonce-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to output directory {p}: {e.strerror or e}; choose another with --out") from None
    return p


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlonce", description="Agentic RL post-training, CPU-first.")
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")

    q = sub.add_parser("quickstart", help="train the embedded agent with the embedded defaults")
    q.add_argument("--out", default="runs/quickstart", help="run directory (default: runs/quickstart)")
    q.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. rl.steps=10")

    t = sub.add_parser("train", help="train from a config file and/or overrides")
    t.add_argument("--config", help="TOML config file (see configs/)")
    t.add_argument("--out", help="run directory (overrides the config's 'out')")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE")

    e = sub.add_parser("eval", help="held-out success of a model on the embedded domain")
    e.add_argument("--model", required=True, help="'embedded' or a model folder (e.g. RUN/checkpoints/step-N)")
    e.add_argument("--tasks", type=int, default=200, help="number of held-out tasks (default 200)")
    e.add_argument("--out", default="runs/eval", help="where the embedded model is materialised if needed")
    e.add_argument("overrides", nargs="*", metavar="KEY=VALUE")

    for p in (q, t, e):
        p.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rlonce.config import load_config, read_saved_config

    if args.verb == "quickstart":
        cfg = load_config(None, [*args.overrides, f"out={args.out}"])
        _writable_dir(cfg.out)
        resume = False
    elif args.verb == "train":
        if args.resume:
            run_dir = Path(args.resume)
            if not (run_dir / "config.json").is_file():
                raise UsageError(f"{run_dir} is not a run directory (no config.json); pass the --out of an earlier run")
            cfg = read_saved_config(run_dir / "config.json", [*args.overrides, f"out={run_dir}"])
            resume = True
        else:
            extra = [f"out={args.out}"] if args.out else []
            cfg = load_config(args.config, [*args.overrides, *extra])
            resume = False
        _writable_dir(cfg.out)
    else:
        cfg = load_config(None, [*args.overrides, f"out={args.out}"])
        _writable_dir(cfg.out)
        from rlonce.recipes.grpo import evaluate_model

        res = evaluate_model(cfg, args.model, args.tasks, progress=not args.quiet)
        print(f"held-out success {res['success']:.3f} on {res['tasks']} tasks ({res['infra_failed']} infra failures)")
        return 0

    from rlonce.recipes.grpo import run

    summary = run(cfg, resume=resume, progress=not args.quiet)
    print(f"baseline_success {summary['baseline_success']:.3f} -> final_success {summary['final_success']:.3f} "
          f"on {summary['heldout_tasks']} held-out tasks in {summary['wall_seconds']:.0f}s; run directory {cfg.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from rlonce.config import ConfigError

    known: tuple[type[BaseException], ...] = (UsageError, ConfigError)
    try:
        from rlonce.model.loader import ModelLoadError
        from rlonce.sandbox.base import SandboxError
        from rlonce.train.checkpoint import NoCheckpoint

        known += (ModelLoadError, SandboxError, NoCheckpoint)
    except ImportError:  # a broken install still gets its usage errors reported
        pass
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except known as e:
        print(f"rlonce: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlonce: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
