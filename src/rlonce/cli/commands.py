"""What each ``rlonce`` verb does once its arguments are parsed.

Every heavy import (torch, transformers, the recipes) happens inside a handler, so parsing and
usage errors stay fast. A handler returns the exit code; user errors are raised as ``UsageError``
and printed as one line by ``rlonce.cli.main``.
"""

from __future__ import annotations

import argparse
import errno
from collections.abc import Callable
from pathlib import Path

from rlonce.cli.domain_commands import writable_dir as _writable_dir
from rlonce.errors import UsageError

ONE_LINE_OS_ERRORS = {
    errno.ENOSPC: "free disk space or choose another --out",
    errno.EDQUOT: "free disk space or choose another --out",
    errno.EADDRINUSE: "another process listens there: choose another --port (0 picks a free one)",
    errno.EADDRNOTAVAIL: "that --host is not an address of this machine",
    errno.EACCES: "check the permissions (ports below 1024 need root)",
}
"""OS errors that are the user's to fix, printed as one line with what to do."""


def train_config(args):
    """``rlonce train``'s config and whether it resumes: ``--resume RUN_DIR``, or ``--config FILE``
    / a positional ``FILE.toml``, then the overrides and ``--out``."""
    from rlonce.config import load_config, read_saved_config

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.json").is_file():
            raise UsageError(f"{run_dir} is not a run directory (no config.json); pass the --out of an earlier run")
        return read_saved_config(run_dir / "config.json", [*args.overrides, f"out={run_dir}"]), True
    config, overrides = config_file(args)
    return load_config(config, [*overrides, *([f"out={args.out}"] if args.out else [])]), False


def config_file(args) -> tuple[str | None, list[str]]:
    """``--config FILE`` or a first positional ``FILE.toml`` (``rlonce train configs/x.toml k=v``);
    the overrides."""
    config, overrides = args.config, list(args.overrides)
    if overrides and "=" not in overrides[0]:
        if config:
            raise UsageError(f"two configs given: --config {config} and {overrides[0]}")
        config, overrides = overrides[0], overrides[1:]
    return config, overrides


def _run(cfg, resume: bool, args) -> int:
    """The GRPO job of ``quickstart`` and ``train``, on a checked config."""
    from rlonce.recipes.grpo import run

    summary = run(cfg, resume=resume, progress=not args.quiet, accept_changes=getattr(args, "accept_changes", False))
    reward = ("" if summary.get("baseline_reward") is None else
              f" (mean reward {summary['baseline_reward']:.3f} -> {summary['final_reward']:.3f})")
    print(f"baseline_success {summary['baseline_success']:.3f} -> final_success {summary['final_success']:.3f}{reward} "
          f"on {summary['heldout_tasks']} held-out tasks in {summary['wall_seconds']:.0f}s; run directory {cfg.out}")
    if ch := summary.get("heldout_change"):
        print(f"  paired over {ch['attempts']} held-out attempts (eval/baseline.jsonl vs eval/final.jsonl): "
              f"success {ch['passed_change']:+.3f} ± {ch['passed_change_se']:.3f}, "
              f"reward {ch['reward_change']:+.3f} ± {ch['reward_change_se']:.3f} (± one standard error)")
    if len(summary["sources"]) > 1:
        for label, src in summary["sources"].items():
            ch = src.get("heldout_change")
            paired = f", paired {ch['passed_change']:+.3f} ± {ch['passed_change_se']:.3f}" if ch else ""
            reward = ("" if src.get("baseline_reward") is None else
                      f", reward {src['baseline_reward']:.3f} -> {src['final_reward']:.3f}")
            print(f"  {label}: {src['baseline_success']:.3f} -> {src['final_success']:.3f} on {src['heldout_tasks']} "
                  f"held-out tasks{paired}{reward} (share {src['share']:.2f}, trained {src['trained_share']:.2f} "
                  f"of the retained sequences, {src.get('groups_retained', 0)} groups)")
    _say_rft(summary.get("rft"))
    _say_untrained(summary)
    _say_grading(summary.get("grading") or {})
    _say_distill(summary)
    return 0


def _say_distill(summary: dict) -> None:
    """A distillation run's per-source recovery: student before → after against its teacher (an
    endpoint teacher only scores: it is not evaluated)."""
    for label, src in summary["sources"].items():
        if "teacher" not in src:
            continue
        if "teacher_success" not in src:
            print(f"  distill {label}: teacher not evaluated (an endpoint), student {src['baseline_success']:.3f} -> "
                  f"{src['final_success']:.3f}")
            continue
        rec = "n/a (the teacher scored 0)" if src["recovery"] is None else f"{src['recovery']:.2f}"
        vs = src.get("vs_teacher")
        paired = f"; after - teacher {vs['passed_change']:+.3f} ± {vs['passed_change_se']:.3f} paired" if vs else ""
        print(f"  distill {label}: teacher {src['teacher_success']:.3f}, student {src['baseline_success']:.3f} -> "
              f"{src['final_success']:.3f}, recovery {rec} (student after / teacher{paired})")


def _say_rft(rft: dict | None) -> None:
    """What RFT trained on, before the baseline evaluation (whose numbers include it); loud when nothing."""
    if not rft:
        return
    kept = sum(c["kept"] for c in rft.values())
    print(f"  RFT before the baseline: fine-tuned on {kept} of the model's own passing attempts ("
          + "; ".join(f"{k} {c['kept']} from {c['tasks_passed']} of {c['tasks']} tasks" for k, c in rft.items()) + ")")
    if not kept:
        print("WARNING: RFT kept no attempt (the model passed no training task): it fine-tuned on nothing")


def _say_untrained(summary: dict) -> None:
    """Loud lines when RL steps trained nothing, or a source trained no group: the held-out change
    is then not RL's, and the reason (from the ledger) is on the line."""
    steps, nothing = summary.get("rl_steps", 0), summary.get("steps_trained_nothing", 0)
    if steps and nothing:
        print(f"WARNING: steps that trained nothing: {nothing}/{steps}"
              + (" — this run did not train the model" if nothing == steps else ""))
    for label, src in summary["sources"].items() if steps else ():
        if src.get("groups_retained"):
            continue
        passed, no_contrast = src.get("sequences_all_passed", 0), src.get("sequences_no_contrast", 0)
        why = [f"{no_contrast - passed} of {src['sequences_dispatched']} sequences in groups that all failed"
               if no_contrast - passed else "", f"{passed} in groups that all passed" if passed else "",
               f"{src['groups_short']} groups short of the target" if src.get("groups_short") else ""]
        print(f"WARNING: source {label} trained no group in {steps} steps: "
              + (", ".join(w for w in why if w) or "nothing dispatched"))


def _say_grading(g: dict) -> None:
    """Loud lines when the model graders' numbers are not the judge's: GAR or GRS mostly fell back,
    or the hack audit confirmed most of what it read (a policy's attempts are mostly not hacks: a judge
    that flags most of them is not auditing, and its confirmations still cost the attempts their reward)."""
    for part in ("gar", "grs"):
        rate = g.get(f"grading/{part}_fallback_rate")
        if rate is not None and rate > 0.05:
            why = ", ".join(f"{k.rsplit('_fallback_', 1)[1]} {v:g}" for k, v in g.items()
                            if k.startswith(f"grading/{part}_fallback_") and not k.endswith("_rate"))
            print(f"WARNING: {part.upper()} fell back to the verifier's reward on {rate:.0%} of its questions ({why})")
    audited, confirmed = g.get("grading/audited", 0), g.get("grading/audit_confirmed", 0)
    if audited >= 10 and confirmed > 0.5 * audited:
        print(f"WARNING: the hack audit confirmed {confirmed:g} of {audited:g} audited attempts "
              f"({confirmed / audited:.0%}): a judge that flags most attempts is not auditing them "
              "(see grading/kappa and docs/grading.md)")


def _quickstart(args) -> int:
    from rlonce.config import load_config
    from rlonce.rollout.sources import check_sources

    cfg = load_config(None, [*args.overrides, f"out={args.out}"])
    check_sources(cfg)
    _writable_dir(cfg.out)
    return _run(cfg, False, args)


def _train(args) -> int:
    from rlonce.rollout.sources import check_sources

    cfg, resume = train_config(args)
    check_sources(cfg)
    _writable_dir(cfg.out)
    return _run(cfg, resume, args)


def _distill(args) -> int:
    from rlonce.config import ConfigError
    from rlonce.rollout.sources import check_sources

    cfg, resume = train_config(args)
    if not any(p.distills for p in check_sources(cfg)):
        raise ConfigError("rlonce distill needs a teacher: set distill.teacher, or teacher in a [[sources]] table "
                          "(docs/distillation.md)")
    _writable_dir(cfg.out)
    return _run(cfg, resume, args)


def _eval(args) -> int:
    from rlonce.config import load_config
    from rlonce.rollout.sources import check_sources

    config, overrides = config_file(args)
    cfg = load_config(config, [*overrides, f"out={args.out}"])
    check_sources(cfg)
    _writable_dir(cfg.out)
    from rlonce.recipes.grpo import evaluate_model

    res = evaluate_model(cfg, args.model, args.tasks, progress=not args.quiet, harness_cmd=args.harness_cmd,
                         harness_name=args.harness_name, harness_tasks=args.harness_tasks,
                         harness_timeout=args.harness_timeout, harness_concurrency=args.harness_concurrency)
    print(f"every attempt: {cfg.out}/eval/eval.jsonl" + (f" and {args.harness_name}.jsonl" if args.harness_cmd else ""))
    print(f"held-out success {res['success']:.3f}, mean reward {res['reward']:.3f} on {res['tasks']} tasks "
          f"({res['infra_failed']} infra failures)")
    for arm, v in res["per_arm"].items():
        if arm == args.harness_name and "outside" in res:
            o = res["outside"]
            ends = ", ".join(f"{k} {n}" for k, n in o["statuses"].items() if n)
            print(f"  {arm:<18} {v:.3f}  ({o['tasks']} tasks, outside harness; {ends}; "
                  f"{o['turns_mean']:.1f} turns/episode)")
        else:
            print(f"  {arm:<18} {v:.3f}  ({res['tasks']} tasks)")
    return 0


def _tasks(args) -> int:
    from rlonce.cli import domain_commands as dc
    from rlonce.cli.grade_commands import tasks_audit

    return {"build": dc.tasks_build, "validate": dc.tasks_validate, "filter": dc.tasks_filter,
            "audit": tasks_audit}[args.action](args)


def _probe(args) -> int:
    from rlonce.cli.domain_commands import probe

    return probe(args)


def _domains(args) -> int:
    """``rlonce domains``: each domain's summary, options, verbs and needs; 1 when one does not load."""
    from rlonce.cli.domain_commands import list_domains

    return list_domains(args)


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
            hint = ONE_LINE_OS_ERRORS.get(e.errno, "choose another --host or --port")
            raise UsageError(f"serve: cannot listen on {host}:{port}: {e.strerror or e}; {hint}") from None


def _is_loopback(host: str) -> bool:
    import ipaddress
    import socket

    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
        return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)
    except (OSError, ValueError):
        return False


def _serve(args) -> int:
    import asyncio

    keys = [k.strip() for k in (args.api_key or [])]  # clients' keys arrive stripped
    if not all(keys):
        raise UsageError("serve: --api-key must not be empty")
    _check_listen(args.host, args.port)  # a bad address is named first (a bind, closed at once, never listened on)
    if not keys and not _is_loopback(args.host):
        raise UsageError(f"serve: --host {args.host} is reachable beyond this machine; pass --api-key KEY (one or "
                         "more) so that only holders of a key can open sessions, or serve on 127.0.0.1")
    import torch

    torch.set_num_threads(1)
    from concurrent.futures import ThreadPoolExecutor

    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.http import AsyncServer, load_admin_key, make_app
    from rlonce.gateway.session import GatewaySettings
    from rlonce.model import loader
    from rlonce.model.chat import get_format

    key_file = Path(args.admin_key_file or _writable_dir(args.out) / "admin-key")
    try:
        admin_key = load_admin_key(key_file)
    except (OSError, ValueError) as e:
        raise UsageError(f"serve: cannot use the admin key file {key_file}: {e}") from None
    lm = loader.load(loader.resolve(args.model, _writable_dir(args.out) / "cache"))
    pad = lm.tokenizer.pad_token_id
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=pad if pad is not None else 0,
                         prefix_cache_mb=args.prefix_cache_mb, compile_solo=args.compile, tokenizer=lm.tokenizer)
    limit = args.max_context or getattr(lm.model.config, "max_position_embeddings", 4096)
    name = "embedded" if args.model == "embedded" else Path(args.model).name
    gw = Gateway(GatewaySettings.serving(
        engine=engine, encode=lm.encode, decode=lm.decode, fmt=get_format(lm.chat_format), model_name=name,
        max_tokens=args.max_tokens, max_context=limit, tokenizer=lm.tokenizer, session_ttl=args.session_ttl,
        max_inflight=args.max_inflight, busy_wait=args.busy_wait,
        offload=ThreadPoolExecutor(4, thread_name_prefix="rlonce-gateway")))

    async def main() -> None:
        if args.compile:
            await _warm_compiled(engine)
        app = make_app(gw, admin_key=admin_key, api_keys=keys or None)
        async with AsyncServer(app, host=args.host, port=args.port) as srv:
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


async def _warm_compiled(engine) -> None:
    """``serve --compile``: compile the one-session decode before listening, not on a client's turn."""
    import asyncio

    print("compiling the one-session decode step (torch.compile: seconds for the embedded model, "
          "about a minute for SmolLM2)", flush=True)
    failed = await asyncio.get_running_loop().run_in_executor(None, engine.warm_solo)
    if failed:
        print(f"  compiling failed, decoding eagerly: {failed}", flush=True)


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


def _doctor(args) -> int:
    """``rlonce doctor``: each check of what the job needs, with its fix; 1 when a required one fails."""
    from rlonce.cli.doctor import report, run_checks

    cfg, _ = train_config(args)
    text, status = report(run_checks(cfg))
    print(text)
    return status


def _audit(args) -> int:
    """``rlonce audit RUN``: the verdict of every check; 1 when one fails."""
    from rlonce.recipes.audit import audit, report

    text, status = report(audit(Path(args.run)))
    print(text)
    return status


def _compare(args) -> int:
    """``rlonce compare BEFORE AFTER``: per source, success before and after on the attempts both
    scored, the paired change and its standard error (``rlonce.recipes.evaluate.paired_change``)."""
    from rlonce.recipes.evaluate import compare

    rows = compare(Path(args.before), Path(args.after))
    print(f"{'source':<16} {'attempts':>8} {'before':>7} {'after':>7}  {'paired change ± SE':<20} reward change ± SE")
    for r in rows:
        mean, se = r["passed_change"], r["passed_change_se"]
        mark = "  (≥ 2 SE)" if se > 0 and abs(mean) >= 2 * se else ""
        print(f"{r['source']:<16} {r['attempts']:>8} {r['before']:>7.3f} {r['after']:>7.3f}  "
              f"{mean:+.3f} ± {se:.3f}{mark:<10} "
              f"{r['reward_change']:+.3f} ± {r['reward_change_se']:.3f}")
    return 0


def _grade(args) -> int:
    from rlonce.cli.grade_commands import grade

    return grade(args)


def _view(args) -> int:
    """``rlonce view RUN``: serve the run's debugging page on loopback until Ctrl-C."""
    from rlonce.recipes.view import serve

    try:
        serve(Path(args.run), args.host, args.port)
    except KeyboardInterrupt:
        pass
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "quickstart": _quickstart, "train": _train, "distill": _distill, "eval": _eval, "serve": _serve, "tasks": _tasks,
    "probe": _probe,
    "config": _config_show, "doctor": _doctor, "audit": _audit, "compare": _compare, "view": _view, "grade": _grade,
    "domains": _domains,
}
"""Each verb's handler; ``rlonce.cli.parser`` defines the same verbs."""
