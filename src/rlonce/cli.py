"""``rlonce`` console script. Arguments are parsed before any heavy library is imported.

Verbs:
  quickstart  train the embedded agent with the embedded defaults (SFT, then GRPO) on CPU
  train       the same job from a TOML config and/or key=value overrides; --resume RUN_DIR
  eval        held-out success of a model folder on the embedded domain, per harness arm
  serve       the gateway over HTTP on loopback for any model rlonce can load
  tasks       build or validate a task pack (``tasks build code --out DIR``, ``tasks validate DIR``)
  probe       run the scripted hack agent's shortcut routes on a pack (``probe code --pack DIR``)
  config      ``config show [KEY]``: every config key's resolved value, docstring and default
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import math
import os
import re
import sys
from pathlib import Path

from rlonce.errors import RlonceError, UsageError


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit code 2, like every other usage error."""

    def error(self, message: str):
        verb = self.prog.removeprefix("rlonce").strip()
        raise UsageError(f"{verb + ': ' if verb else ''}{message} (see `{self.prog} --help`)")


def _int(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range: use {lo}..{hi}")
        return v
    return parse


def _shard(text: str) -> tuple[int, int]:
    i, sep, n = text.partition("/")
    if not (sep and i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard: write I/N with 1 <= I <= N, e.g. 2/4")
    return int(i), int(n)


def _float(lo: float, hi: float, *, open_low: bool = True):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v) or not (lo < v if open_low else lo <= v) or v > hi:
            raise argparse.ArgumentTypeError(f"{text} is out of range: use a finite value in "
                                             f"{'(' if open_low else '['}{lo:g}, {hi:g}]")
        return v
    return parse


_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _host(text: str) -> str:
    """An IP address or an RFC 1123 host name (a dotted all-digit name must be a valid IPv4)."""
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    labels = text.removesuffix(".").split(".")
    if (len(text) <= 253 and all(_HOSTNAME.fullmatch(x) for x in labels)
            and not all(x.isdigit() for x in labels)):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not an IP address or host name (e.g. 127.0.0.1, localhost)")


def _writable_dir(path: str) -> Path:
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".rlonce-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to output directory {p}: {e.strerror or e}; "
                         "choose another with --out") from None
    return p


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="rlonce", description="Agentic RL post-training, CPU-first.")
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")

    q = sub.add_parser("quickstart", help="train the embedded agent with the embedded defaults")
    q.add_argument("--out", default="runs/quickstart", help="run directory (default: runs/quickstart)")
    q.add_argument("--mode", choices=["sync", "async"], help="rollout mode (rollout.mode; default sync)")
    q.add_argument("--executor", choices=["local", "ray"],
                   help="run rollouts, engine and trainer in this process or as Ray actors (default local)")
    q.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. rl.steps=10")

    t = sub.add_parser("train", help="train from a config file and/or overrides")
    t.add_argument("--config", help="TOML config file (see configs/)")
    t.add_argument("--out", help="run directory (overrides the config's 'out')")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("--mode", choices=["sync", "async"], help="rollout mode (rollout.mode)")
    t.add_argument("--executor", choices=["local", "ray"],
                   help="executor (config key 'executor'; see docs/scale-out.md)")
    t.add_argument("overrides", nargs="*", metavar="[CONFIG.toml] KEY=VALUE",
                   help="a TOML config (like --config) and/or config overrides")

    e = sub.add_parser("eval", help="held-out success of a model on the embedded domain")
    e.add_argument("--model", required=True, help="'embedded' or a model folder (e.g. RUN/checkpoints/step-N)")
    e.add_argument("--tasks", type=_int(1, 1_000_000), default=200, help="number of held-out tasks (default 200)")
    e.add_argument("--out", default="runs/eval", help="where the embedded model is materialised if needed")
    e.add_argument("--harness-cmd", metavar="CMD",
                   help="also evaluate an outside agent command that reads OPENAI_BASE_URL/OPENAI_API_KEY (or the "
                        "ANTHROPIC_ ones), e.g. 'python -m rlonce.harness.mswea' (mini-swe-agent)")
    e.add_argument("--harness-name", default="outside", help="label of the outside harness in the report")
    e.add_argument("--harness-tasks", type=_int(1, 1_000_000), default=20,
                   help="held-out tasks for the outside harness (default 20)")
    e.add_argument("--harness-timeout", type=_float(0, 86_400), default=300.0,
                   help="seconds per outside episode, in (0, 86400] (default 300)")
    e.add_argument("overrides", nargs="*", metavar="KEY=VALUE")

    sv = sub.add_parser("serve", help="serve a model through the gateway (OpenAI and Anthropic protocols)")
    sv.add_argument("--model", required=True, help="'embedded' or a model folder (e.g. RUN/checkpoints/step-N)")
    sv.add_argument("--port", type=_int(0, 65535), default=8000,
                    help="port, 0..65535 (default 8000; 0 picks a free one)")
    sv.add_argument("--host", type=_host, default="127.0.0.1",
                    help="bind address: an IP address or host name (default loopback only)")
    sv.add_argument("--max-context", type=_int(1, 1_048_576),
                    help="trajectory budget per session in tokens (default: the model's)")
    sv.add_argument("--max-tokens", type=_int(1, 1_048_576), default=256,
                    help="per-turn output cap, >= 1 (default 256)")
    sv.add_argument("--out", default="runs/serve", help="where the embedded model is materialised if needed")
    sv.add_argument("--admin-key-file", help="file holding the admin key for the trajectory, reward and listing "
                    "routes; made (mode 0600, a fresh key) if missing (default OUT/admin-key)")
    sv.add_argument("--session-ttl", type=_float(0, 1e7), default=900.0,
                    help="seconds an unused session is kept (default 900; ended sessions: at most 60)")

    tk = sub.add_parser("tasks", help="build or validate a task pack")
    tsub = tk.add_subparsers(dest="action", required=True, metavar="ACTION")
    tb = tsub.add_parser("build", help="synthesise tasks from real packages")
    tb.add_argument("domain", choices=["code"])
    tb.add_argument("--out", required=True, help="pack directory to write")
    tb.add_argument("--per-package", type=_int(1, 100_000), default=40, help="tasks per package, >= 1 (default 40)")
    tb.add_argument("--packages", help="comma-separated subset of the pinned packages (default: all)")
    tb.add_argument("--seed", type=_int(0, 2**32 - 1), default=0)
    tf = tsub.add_parser("filter", help="keep tasks whose pass rate under a model is in (0, max-pass)")
    tf.add_argument("domain", choices=["reasoning"])
    tf.add_argument("--out", required=True, help="folder for filter.json / filter.jsonl (use it as task.pack)")
    tf.add_argument("--model", default="smollm2", help="'embedded', 'smollm2' or a model folder (default smollm2)")
    tf.add_argument("--tasks", type=_int(1, 1_000_000), default=256,
                    help="train tasks to measure, from index 0 (default 256)")
    tf.add_argument("--k", type=_int(1, 1024), default=8, help="samples per task (default 8)")
    tf.add_argument("--max-pass", type=_float(0, 1), default=0.9,
                    help="keep pass rates strictly below this, in (0, 1] (default 0.9)")
    tf.add_argument("--config",
                    help="TOML config giving task.* and harness sampling (e.g. configs/smollm2_reasoning.toml)")
    tf.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    tv = tsub.add_parser("validate", help="run the quality gates and write validation.json")
    tv.add_argument("pack", help="pack directory")
    tv.add_argument("--reruns", type=_int(1, 1000), default=8, help="runs per state for the stability gate (default 8)")
    tv.add_argument("--json", action="store_true", help="print the report as one JSON object")

    pr = sub.add_parser("probe", help="try known shortcut routes on every task of a pack")
    pr.add_argument("domain", choices=["code"])
    pr.add_argument("--pack", required=True)
    pr.add_argument("--routes", help="comma-separated subset of routes (default: all)")
    pr.add_argument("--limit", type=_int(1, 1_000_000), help="probe N validated tasks spread evenly over the pack")
    pr.add_argument("--interceptor", choices=["both", "on", "off"], default="both",
                    help="run the routes with the action guard on, off (the grader alone) or both in turn (default)")
    pr.add_argument("--no-interceptor", action="store_true", help="the same as --interceptor off")
    pr.add_argument("--shard", type=_shard, help="I/N: probe only every N-th task starting at the I-th (1-based), "
                    "to split a long probe over processes or sessions")
    pr.add_argument("--record", help="JSONL file that gets one line per attempt; a rerun with the same file skips "
                    "what is recorded, so an interrupted probe resumes")
    pr.add_argument("--concurrency", type=_int(1, 64), default=2, help="attempts at once (default 2)")
    pr.add_argument("--json", action="store_true", help="print the report as one JSON object")

    cf = sub.add_parser("config", help="show the resolved configuration with each key's docstring and default")
    csub = cf.add_subparsers(dest="action", required=True, metavar="ACTION")
    cs = csub.add_parser("show", help="every key's resolved value, docstring and default (or only KEY's)")
    cs.add_argument("--config", help="TOML config file (see configs/)")
    cs.add_argument("--resume", metavar="RUN_DIR", help="show the saved config of the run in RUN_DIR")
    cs.add_argument("overrides", nargs="*", metavar="[CONFIG.toml] [KEY] [KEY=VALUE]",
                    help="a TOML config (like --config), a dotted key to show (e.g. rl.lr; a section shows all "
                         "its keys) and/or config overrides")
    cs.set_defaults(out=None)

    for p in (q, t, e, tb, tv, tf, pr, sv):
        p.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def _tasks(args) -> int:
    import json

    if args.action == "filter":
        from rlonce.config import load_config
        from rlonce.recipes.filter import filter_tasks

        out = _writable_dir(args.out)
        cfg = load_config(args.config, ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0",
                                        *args.overrides, f"out={out}"])
        try:
            r = filter_tasks(cfg, args.model, args.tasks, args.k, out, max_pass=args.max_pass, progress=not args.quiet)
        except ValueError as e:
            raise UsageError(str(e)) from None
        print(f"kept {r['kept_count']} of {r['tasks']} tasks "
              f"(pass rate over {r['k']} samples in (0, {r['max_pass']})); "
              f"histogram {r['pass_rate_histogram']}; next: task.pack={out}")
        return 0
    if args.action == "build":
        from rlonce.envs.code.build import build_pack
        from rlonce.envs.code.packages import PACKAGES

        names = args.packages.split(",") if args.packages else list(PACKAGES)
        unknown = [n for n in names if n not in PACKAGES]
        if unknown:
            raise UsageError(f"unknown package(s) {', '.join(unknown)}; pinned packages: {', '.join(PACKAGES)}")
        out = _writable_dir(args.out)
        tasks = build_pack(out, [PACKAGES[n] for n in names], args.per_package, seed=args.seed,
                           progress=not args.quiet)
        print(f"wrote {len(tasks)} tasks from {len(names)} packages to {out}; "
              f"next: rlonce tasks validate {out}")
        return 0
    from rlonce.envs.code.validate import validate_pack

    report = validate_pack(Path(args.pack), reruns=args.reruns, progress=not args.quiet and not args.json)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "validated_ids"}))
    else:
        print(f"{report['validated']} of {report['tasks']} tasks validated "
              f"({', '.join(f'{k} {v}' for k, v in sorted(report['packages'].items()))}); "
              f"dropped: {report['dropped'] or 'none'}; report in {Path(args.pack) / 'validation.json'}")
    return 0


def _probe(args) -> int:
    import json

    from rlonce.envs.code.probe import ROUTES, format_report, probe_pack
    from rlonce.envs.code.validate import validated_tasks

    routes = args.routes.split(",") if args.routes else None
    unknown = [r for r in routes or [] if r not in ROUTES]
    if unknown:
        raise UsageError(f"unknown probe route(s) {', '.join(unknown)}; known: {', '.join(ROUTES)}")
    if args.record:
        try:
            Path(args.record).open("a").close()
        except OSError as e:
            raise UsageError(f"cannot write the probe record {args.record}: {e.strerror or e}; "
                             "choose another --record path") from None
    tasks = validated_tasks(Path(args.pack))
    if args.limit:
        tasks = tasks[:: max(1, len(tasks) // args.limit)][: args.limit]
    if args.shard:
        tasks = tasks[args.shard[0] - 1:: args.shard[1]]
    if not tasks:
        raise UsageError(f"{args.pack} has no validated tasks to probe" + (" in this shard" if args.shard else ""))
    mode = "off" if args.no_interceptor else args.interceptor
    report = probe_pack(tasks, routes=routes, intercept={"both": "both", "on": True, "off": False}[mode],
                        concurrency=args.concurrency, progress=not args.quiet and not args.json,
                        record=Path(args.record) if args.record else None)
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def _check_listen(host: str, port: int) -> None:
    """Resolve ``host`` and bind ``host:port`` once before the model loads, so that a bad address or
    a taken port is one line now rather than the server's failure later."""
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise UsageError(f"serve: cannot resolve --host {host!r}: {e.strerror}; pass an IP address or a known "
                         "host name") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            hint = _ONE_LINE_OS_ERRORS.get(e.errno, "choose another --host or --port")
            raise UsageError(f"serve: cannot listen on {host}:{port}: {e.strerror or e}; {hint}") from None


def _serve(args) -> int:
    import asyncio

    _check_listen(args.host, args.port)
    import torch

    torch.set_num_threads(1)
    from concurrent.futures import ThreadPoolExecutor

    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.http import AsyncServer, load_admin_key, make_app
    from rlonce.gateway.session import Budgets, GatewaySettings
    from rlonce.model import loader
    from rlonce.model.chat import get_format

    key_file = Path(args.admin_key_file or _writable_dir(args.out) / "admin-key")
    try:
        admin_key = load_admin_key(key_file)
    except (OSError, ValueError) as e:
        raise UsageError(f"serve: cannot use the admin key file {key_file}: {e}") from None
    lm = loader.load(loader.resolve(args.model, _writable_dir(args.out) / "cache"))
    pad = lm.tokenizer.pad_token_id
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=pad if pad is not None else 0)
    limit = args.max_context or getattr(lm.model.config, "max_position_embeddings", 4096)
    name = "embedded" if args.model == "embedded" else Path(args.model).name
    gw = Gateway(GatewaySettings(
        engine, lm.encode, lm.decode, get_format(lm.chat_format), sampling=SamplingParams(max_tokens=args.max_tokens),
        budgets=Budgets(args.max_tokens, limit), model_name=name, auto_open=True, honor_client_sampling=True,
        idle_ttl=args.session_ttl, ended_ttl=min(args.session_ttl, 60.0), tokenizer=lm.tokenizer,
        offload=ThreadPoolExecutor(4, thread_name_prefix="rlonce-gateway")))

    async def main() -> None:
        async with AsyncServer(make_app(gw, admin_key=admin_key), host=args.host, port=args.port) as srv:
            print(f"rlonce gateway for {name} at {srv.base_url}\n"
                  f"  OpenAI:    base_url={srv.base_url}/v1  (an API key opens a session; only that key continues it)\n"
                  f"  Anthropic: base_url={srv.base_url}\n"
                  f"  trajectory: GET {srv.base_url}/sessions/KEY/trajectory with the admin key in {key_file}\n"
                  f"  Ctrl-C stops", flush=True)
            await srv.task

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        engine.close()
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # KEY=VALUE overrides after options that follow another positional (argparse stops there)
        if not hasattr(args, "overrides") or any("=" not in x or x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    if getattr(args, "mode", None):
        args.overrides = [*args.overrides, f"rollout.mode={args.mode}"]
    if getattr(args, "executor", None):
        args.overrides = [*args.overrides, f"executor={args.executor}"]
    return args


def train_config(args):
    """``rlonce train``'s config and whether it resumes: ``--resume RUN_DIR``, or ``--config FILE``
    / a positional ``FILE.toml``, then the overrides and ``--out``."""
    from rlonce.config import load_config, read_saved_config

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.json").is_file():
            raise UsageError(f"{run_dir} is not a run directory (no config.json); pass the --out of an earlier run")
        return read_saved_config(run_dir / "config.json", [*args.overrides, f"out={run_dir}"]), True
    config, overrides = args.config, list(args.overrides)
    if overrides and "=" not in overrides[0]:  # `rlonce train configs/x.toml k=v`
        if config:
            raise UsageError(f"two configs given: --config {config} and {overrides[0]}")
        config, overrides = overrides[0], overrides[1:]
    return load_config(config, [*overrides, *([f"out={args.out}"] if args.out else [])]), False


def _config_show(args) -> int:
    """``rlonce config show [KEY]``: the config ``rlonce train`` would run with the same arguments."""
    from rlonce.config import settings

    keys = [x for x in args.overrides if "=" not in x and not x.endswith(".toml")]
    if len(keys) > 1:
        raise UsageError(f"config show: one KEY at most, got {' '.join(keys)}")
    args.overrides = [x for x in args.overrides if x not in keys]
    cfg, _ = train_config(args)
    rows = settings(cfg)
    if keys:
        key = keys[0]
        shown = [r for r in rows if r.key == key or r.key.startswith(key + ".")]
        if not shown:
            parent = key.rpartition(".")[0]
            inside = [r.key.removeprefix(parent + ".").split(".")[0] for r in rows
                      if parent and r.key.startswith(parent + ".")]
            known = inside or [r.key.split(".")[0] for r in rows]
            raise UsageError(f"config show: unknown config key {key!r}; known keys{f' in {parent}' if inside else ''}: "
                             f"{', '.join(dict.fromkeys(known))}")
        rows = shown
    print("\n".join(r.text() for r in rows))
    return 0


def _main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rlonce.config import load_config

    if args.verb == "tasks":
        return _tasks(args)
    if args.verb == "probe":
        return _probe(args)
    if args.verb == "serve":
        return _serve(args)
    if args.verb == "config":
        return _config_show(args)
    from rlonce.envs.domains import check_domain_settings

    if args.verb == "quickstart":
        cfg = load_config(None, [*args.overrides, f"out={args.out}"])
        check_domain_settings(cfg)
        _writable_dir(cfg.out)
        resume = False
    elif args.verb == "train":
        cfg, resume = train_config(args)
        check_domain_settings(cfg)
        _writable_dir(cfg.out)
    else:
        cfg = load_config(None, [*args.overrides, f"out={args.out}"])
        check_domain_settings(cfg)
        _writable_dir(cfg.out)
        from rlonce.recipes.grpo import evaluate_model

        res = evaluate_model(cfg, args.model, args.tasks, progress=not args.quiet, harness_cmd=args.harness_cmd,
                             harness_name=args.harness_name, harness_tasks=args.harness_tasks,
                             harness_timeout=args.harness_timeout)
        print(f"held-out success {res['success']:.3f} on {res['tasks']} tasks ({res['infra_failed']} infra failures)")
        for arm, v in res["per_arm"].items():
            if arm == args.harness_name and "outside" in res:
                o = res["outside"]
                ends = ", ".join(f"{k} {n}" for k, n in o["statuses"].items() if n)
                print(f"  {arm:<18} {v:.3f}  ({o['tasks']} tasks, outside harness; {ends}; "
                      f"{o['turns_mean']:.1f} turns/episode)")
            else:
                print(f"  {arm:<18} {v:.3f}  ({res['tasks']} tasks)")
        return 0

    from rlonce.recipes.grpo import run

    summary = run(cfg, resume=resume, progress=not args.quiet)
    print(f"baseline_success {summary['baseline_success']:.3f} -> final_success {summary['final_success']:.3f} "
          f"on {summary['heldout_tasks']} held-out tasks in {summary['wall_seconds']:.0f}s; run directory {cfg.out}")
    return 0


_ONE_LINE_OS_ERRORS = {
    errno.ENOSPC: "free disk space or choose another --out",
    errno.EDQUOT: "free disk space or choose another --out",
    errno.EADDRINUSE: "another process listens there: choose another --port (0 picks a free one)",
    errno.EADDRNOTAVAIL: "that --host is not an address of this machine",
    errno.EACCES: "check the permissions (ports below 1024 need root)",
}
"""OS errors that are the user's to fix, printed as one line with what to do."""


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except RlonceError as e:
        print(f"rlonce: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in _ONE_LINE_OS_ERRORS:
            raise
        where = f" ({e.filename})" if e.filename else ""
        print(f"rlonce: error: {e.strerror or e}{where}; {_ONE_LINE_OS_ERRORS[e.errno]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlonce: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
