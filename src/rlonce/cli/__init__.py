"""``rlonce`` console script. Arguments are parsed before any heavy library is imported.

Verbs:
  quickstart  train the embedded agent with the embedded defaults (SFT, then GRPO) on CPU
  train       the same job from a TOML config and/or key=value overrides; --resume RUN_DIR
  eval        held-out success of a model folder on the embedded domain, per harness arm
  serve       the gateway over HTTP on loopback for any model rlonce can load
  tasks       build, validate, filter or audit a task pack (``tasks build DOMAIN --out DIR``, ``tasks validate
              DIR``, ``tasks filter DOMAIN --out DIR``, ``tasks audit DIR``), as the pack's domain offers
  grade       offline model grading of a pack (``grade synthesize-rubrics --pack DIR``: GRS rubrics)
  probe       run a domain's known shortcut routes against its grader (``probe DOMAIN [--pack DIR]``)
  domains     every domain the registry knows: its summary, options, verbs and what it needs
  config      ``config show [KEY]``: every config key's resolved value, docstring and default
  doctor      check this machine for what the configured job needs, with the command that fixes each gap
  audit       check a run offline: trained tokens, ledgers, groups, advantages, checkpoints
  view        a web page on loopback to debug a run: steps, groups, sequences, coloured tokens, plots

``parser`` holds the argument parser, ``commands`` the verbs' handlers (``domain_commands`` those that
reach domains through the registry, ``grade_commands`` the offline grading ones); this module
catches the errors that are the user's to fix and prints each as one line.
"""

from __future__ import annotations

import os
import sys

from rlonce.cli.commands import COMMANDS, ONE_LINE_OS_ERRORS, train_config
from rlonce.cli.parser import _parser, parse_args
from rlonce.core import faults
from rlonce.errors import RlonceError, UsageError

__all__ = ["UsageError", "_parser", "main", "parse_args", "train_config"]


def _main(argv: list[str]) -> int:
    args = parse_args(argv)
    faults.check()  # a mistyped RLONCE_FAULTS is a usage error now, not a failure deep in a run
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return COMMANDS[args.verb](args)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except RlonceError as e:
        print(f"rlonce: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in ONE_LINE_OS_ERRORS:
            raise
        where = f" ({e.filename})" if e.filename else ""
        print(f"rlonce: error: {e.strerror or e}{where}; {ONE_LINE_OS_ERRORS[e.errno]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlonce: interrupted", file=sys.stderr)
        return 130
