"""The ``rlonce`` argument parser: one function per verb, value checks that fail as one line.

Only the standard library and ``rlonce.errors`` are imported here, so a bad argument is reported
before anything heavy loads. The verbs whose arguments depend on the domains (``tasks``, ``probe``)
load the domain registry first: each domain's pack tools and probe add their subcommand, and the
fields of its options and settings models become flags (``_model_flags``). No domain is named here.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from functools import partial

from rlonce.errors import UsageError


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


def _quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _model_flags(p: argparse.ArgumentParser, model, title: str) -> tuple[str, ...]:
    """One flag per field of a domain's pydantic model (``per_package`` → ``--per-package``; a
    boolean that defaults to true: ``--no-...``), its docstring the help and its bounds checked like
    every other flag's. A flag not given stays out of the namespace, so the model's default applies.
    Fields of other types than a boolean, a string Literal, a number or a string, and flags another
    argument holds, get none. Returns the field names given flags (``model_from`` reads them)."""
    group = p.add_argument_group(title)
    added = []
    for name, info in model.model_fields.items():
        kind = _flag_kind(info)
        if kind is None:
            continue
        text = (info.description or "").replace("%", "%%")
        flag = "--" + ("no-" if kind == "bool" and info.default else "") + name.replace("_", "-")
        if kind != "bool" and info.default is not None and "default" not in text:
            text += f" (default {info.default})"
        how = dict(action="store_const", const=not info.default) if kind == "bool" else kind
        try:
            group.add_argument(flag, dest=name, default=argparse.SUPPRESS, help=text, **how)
        except argparse.ArgumentError:  # a generic flag of the verb holds the name
            continue
        added.append(name)
    return tuple(added)


def _flag_kind(info) -> dict | str | None:
    """How a model field is read from the command line: "bool", argparse keywords, or None."""
    import types
    import typing

    kinds = [info.annotation]
    if typing.get_origin(info.annotation) in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(info.annotation) if a is not type(None)]
    if len(kinds) != 1:
        return None
    a = kinds[0]
    if a is bool:
        return "bool"
    if typing.get_origin(a) is typing.Literal and all(isinstance(x, str) for x in typing.get_args(a)):
        return {"choices": list(typing.get_args(a))}
    if a is str:
        return {}
    if a not in (int, float):
        return None
    bound = {k: getattr(m, k) for m in info.metadata for k in ("gt", "ge", "lt", "le")
             if getattr(m, k, None) is not None}
    hi = bound.get("le", bound.get("lt"))  # a strict upper bound is checked by the model
    if a is int:
        lo = bound["gt"] + 1 if "gt" in bound else bound.get("ge", -(2**63))
        return {"type": _int(lo, 2**63 if hi is None else hi), "metavar": "N"}
    lo = bound.get("gt", bound.get("ge", -math.inf))
    return {"type": _float(lo, math.inf if hi is None else hi, open_low="gt" in bound), "metavar": "X"}


def _add_quickstart(sub) -> None:
    q = sub.add_parser("quickstart", help="train the embedded agent with the embedded defaults")
    q.add_argument("--out", default="runs/quickstart", help="run directory (default: runs/quickstart)")
    q.add_argument("--mode", choices=["sync", "async"], help="rollout mode (rollout.mode; default sync)")
    q.add_argument("--executor", choices=["local", "ray"],
                   help="run rollouts, engine and trainer in this process or as Ray actors (default local)")
    q.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. rl.steps=10")
    _quiet(q)


def _add_train(sub, verb: str = "train",
               help: str = "train from a config file and/or overrides") -> None:  # noqa: A002 - argparse's name
    t = sub.add_parser(verb, help=help)
    t.add_argument("--config", help="TOML config file (see configs/)")
    t.add_argument("--out", help="run directory (overrides the config's 'out')")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("--accept-changes", action="store_true",
                   help="with --resume: continue even though the code or the config changed since the run started "
                        "(recorded in RUN_DIR/provenance.json)")
    t.add_argument("--mode", choices=["sync", "async"], help="rollout mode (rollout.mode)")
    t.add_argument("--executor", choices=["local", "ray"],
                   help="executor (config key 'executor'; see docs/scale-out.md)")
    t.add_argument("overrides", nargs="*", metavar="[CONFIG.toml] KEY=VALUE",
                   help="a TOML config (like --config) and/or config overrides")
    _quiet(t)


def _add_eval(sub) -> None:
    e = sub.add_parser("eval", help="held-out success of a model on a config's domain (default: the embedded one)")
    e.add_argument("--model", required=True,
                   help="'embedded', 'smollm2', a model folder or adapter checkpoint (e.g. "
                   "RUN/checkpoints/step-N) or a hub id in the local Hugging Face cache (docs/models.md)")
    e.add_argument("--tasks", type=_int(1, 1_000_000), default=200, help="number of held-out tasks (default 200)")
    e.add_argument("--out", default="runs/eval",
                   help="output folder (default runs/eval): eval/eval.jsonl with every attempt (and the outside "
                        "harness's own JSONL), and the embedded model when it is materialised")
    e.add_argument("--harness-cmd", metavar="CMD",
                   help="also evaluate an outside agent command that reads OPENAI_BASE_URL/OPENAI_API_KEY (or the "
                        "ANTHROPIC_ ones), e.g. 'python -m rlonce.harness.mswea' (mini-swe-agent)")
    e.add_argument("--harness-name", default="outside", help="label of the outside harness in the report")
    e.add_argument("--harness-tasks", type=_int(1, 1_000_000), default=20,
                   help="held-out tasks for the outside harness (default 20)")
    e.add_argument("--harness-timeout", type=_float(0, 86_400), default=300.0,
                   help="seconds per outside episode, in (0, 86400] (default 300)")
    e.add_argument("--harness-concurrency", type=_int(1, 64), default=2,
                   help="outside agents run at a time, 1-64 (default 2; each is a whole process, the engine batches "
                        "their turns)")
    e.add_argument("--config", help="TOML config giving the task, harness and evaluation settings (e.g. the run's "
                                    "configs/general.toml); a first positional FILE.toml works too")
    e.add_argument("overrides", nargs="*", metavar="[CONFIG.toml] KEY=VALUE")
    _quiet(e)


def _add_serve(sub) -> None:
    sv = sub.add_parser("serve", help="serve a model through the gateway (OpenAI and Anthropic protocols)")
    sv.add_argument("--model", required=True,
                    help="'embedded', 'smollm2', a model folder or adapter checkpoint (e.g. "
                    "RUN/checkpoints/step-N) or a hub id in the local Hugging Face cache (docs/models.md)")
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
    sv.add_argument("--api-key", action="append", metavar="KEY",
                    help="accept only requests carrying this key (repeat for several); required when --host is "
                    "not a loopback address. Each key reaches only the sessions it opened")
    sv.add_argument("--max-inflight", type=_int(1, 1_000_000), default=64,
                    help="turns sampled at once; past it a request is answered 429 (Anthropic: 529) with "
                    "retry-after (default 64)")
    sv.add_argument("--busy-wait", type=_float(0, 86_400), default=300.0,
                    help="seconds a request waits for its session's turn in flight (clients that send side "
                    "requests in parallel on one key) before a 409 with retry-after (default 300; 0: refuse at once)")
    sv.add_argument("--prefix-cache-mb", type=_float(0, 1 << 20, open_low=False), default=1024.0,
                    help="memory for finished turns' key/value caches, reused when a later prompt starts with one "
                    "(default 1024; 0 turns reuse off — do that for mutually distrusting clients, whose turn "
                    "latency could otherwise tell them what another served recently)")
    sv.add_argument("--compile", action="store_true",
                    help="decode a lone session with the model torch.compile-d over a static cache (faster per "
                    "token on tiny models; the smallest cache size compiles before serving, larger ones "
                    "once each on first use)")
    _quiet(sv)


def _add_tasks(sub, domains: list) -> None:
    tk = sub.add_parser("tasks", help="build, validate, filter or audit a task pack")
    tsub = tk.add_subparsers(dest="action", required=True, metavar="ACTION")
    builders = [(n, s) for n, s in domains if s.packs and s.packs.build]
    tb = tsub.add_parser("build", help=f"write a task pack of a domain ({', '.join(n for n, _ in builders)})")
    bsub = tb.add_subparsers(dest="domain", required=True, metavar="DOMAIN")
    for name, spec in builders:
        b = bsub.add_parser(name, help=spec.summary)
        b.add_argument("--out", required=True, help="pack directory to write")
        _quiet(b)
        b.set_defaults(setting_flags=_model_flags(b, spec.packs.build_settings, f"{name} pack"))
    filters = [n for n, s in domains if s.packs and s.packs.filter]
    tf = tsub.add_parser("filter", help="keep tasks whose pass rate under a model is in (0, max-pass)")
    tf.add_argument("domain", choices=filters)
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
    _quiet(tf)
    tv = tsub.add_parser("validate", help="run the pack's quality gates (its domain from DIR/pack.json) and write "
                         "validation.json")
    tv.add_argument("pack", help="pack directory")
    tv.add_argument("--reruns", type=_int(1, 1000), default=8, help="runs per state for the stability gate (default 8)")
    tv.add_argument("--json", action="store_true", help="print the report as one JSON object")
    _quiet(tv)
    ta = tsub.add_parser("audit", help="four graded attempts per task, then an auditor flags possible false "
                         "positives and negatives (DIR/audit.json; flagged tasks are not trained on until cleared)")
    ta.add_argument("pack", help="a validated pack directory")
    ta.add_argument("--agent", default="scripted", metavar="scripted|URL",
                    help="who makes the attempts: 'scripted' (expert x2, no-op, test deletion; default), or the base "
                         "URL of a model endpoint (OpenAI protocol, ending in /v1) that makes all four through the "
                         "mini-bash harness")
    ta.add_argument("--agent-model", default="policy", help="model name sent to the agent endpoint (default policy)")
    _grader_flags(ta)


def _grader_flags(p: argparse.ArgumentParser) -> None:
    """What ``tasks audit`` and ``grade synthesize-rubrics`` share: the judge, task count, output."""
    p.add_argument("--tasks", type=_int(1, 1_000_000), help="only the first N validated tasks (default: all)")
    p.add_argument("--judge", "--judge-url", dest="judge", default="scripted", metavar="scripted|URL",
                   help="'scripted' (the rule judge; default) or the judge endpoint's base URL (OpenAI: ending in "
                        "/v1; Anthropic: before /v1/messages)")
    p.add_argument("--judge-model", default="judge", help="model name sent to the judge endpoint (default judge)")
    p.add_argument("--judge-protocol", choices=["openai", "anthropic"], default="openai")
    p.add_argument("--judge-key-env", default="", metavar="VAR",
                   help="environment variable holding the judge's key (default: a placeholder key)")
    p.add_argument("--judge-timeout", type=_float(0, 86_400), default=120.0, help="seconds per judge call")
    p.add_argument("--judge-max-tokens", type=_int(1, 1_048_576), default=384, help="reply token cap per call")
    p.add_argument("--judge-retries", type=_int(0, 10), default=1, help="further tries of a failed call (default 1)")
    p.add_argument("--agentic", action="store_true",
                   help="the judge works as an agent: bash in a sandbox holding the task's repository, the hidden "
                        "tests, the reference patch and every attempt (docs/grading.md)")
    p.add_argument("--concurrency", type=_int(1, 64), default=2, help="attempts at once (default 2)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--progress", action="store_true", help=argparse.SUPPRESS)  # the bar shows unless --quiet
    _quiet(p)


def _add_grade(sub) -> None:
    g = sub.add_parser("grade", help="offline model grading of a pack: rubric synthesis for GRS")
    gsub = g.add_subparsers(dest="action", required=True, metavar="ACTION")
    sr = gsub.add_parser("synthesize-rubrics", help="rollouts on each task; where they pass often enough, a judge "
                         "writes solution and behaviour rubrics (DIR/rubrics.json)")
    sr.add_argument("--pack", required=True, help="a validated code pack directory")
    sr.add_argument("--rollouts", type=_int(1, 64), default=4, help="rollouts per task (default 4)")
    sr.add_argument("--min-pass-rate", type=_float(0, 1, open_low=False), default=0.5,
                    help="tasks whose rollouts pass at least this often get rubrics, in [0, 1] (default 0.5)")
    _grader_flags(sr)


PROBE_FLAGS = {
    "tasks": (("--tasks",), dict(type=_int(1, 100_000), default=50, help="held-out tasks to probe (default 50)")),
    "limit": (("--limit",), dict(type=_int(1, 1_000_000), help="probe N validated tasks spread evenly over the pack")),
    "shard": (("--shard",), dict(type=_shard, help="I/N: probe only every N-th task starting at the I-th (1-based), to "
                                 "split a long probe over processes or sessions")),
    "routes": (("--routes",), dict(help="comma-separated subset of routes (default: all; 'none': only the controls)")),
    "concurrency": (("--concurrency",), dict(type=_int(1, 64), default=2, help="attempts at once (default 2)")),
    "record": (("--record",), dict(help="JSONL file that gets one line per attempt; a rerun with the same file skips "
                                   "what is recorded, so an interrupted probe resumes")),
    "judge": (("--judge",), dict(choices=["none", "scripted"], default="none",
                                 help="who judges the items that ask a judge (default none: they are left out, as in a "
                                      "judge-less config; scripted: the rule-based judge)")),
}
"""The generic flags of ``rlonce probe <domain>``, by the ``ProbeRequest`` field each sets; a domain's
probe gets those its ``Probe.reads`` lists."""


def _add_probe(sub, domains: list) -> None:
    pr = sub.add_parser("probe", help="try a domain's known shortcut routes against its grader (on a pack's tasks "
                        "or on generated ones)")
    psub = pr.add_subparsers(dest="domain", required=True, metavar="DOMAIN")
    for name, spec in domains:
        if spec.probe is None:
            continue
        p = psub.add_parser(name, help=spec.summary)
        for field in spec.probe.reads:
            flags, kw = PROBE_FLAGS[field]
            p.add_argument(*flags, **kw)
        p.add_argument("--no-hostile", action="store_true",
                       help="skip the hostile-input episodes (NUL, surrogates, a megabyte, hostile paths to every "
                            "tool; the report counts those that became infrastructure failures, goal 0)")
        p.add_argument("--json", action="store_true", help="print the report as one JSON object")
        _quiet(p)
        p.set_defaults(option_flags=_model_flags(p, spec.options, f"{name}'s options"),
                       setting_flags=_model_flags(p, spec.probe.settings, f"{name} probe"))


def _add_domains(sub) -> None:
    d = sub.add_parser("domains", help="every domain the registry knows: summary, options, verbs, what it needs")
    d.add_argument("--json", action="store_true", help="print one JSON object per domain, in a list")


def _add_config(sub) -> None:
    cf = sub.add_parser("config", help="show the resolved configuration with each key's docstring and default")
    csub = cf.add_subparsers(dest="action", required=True, metavar="ACTION")
    cs = csub.add_parser("show", help="every key's resolved value, docstring and default (or only KEY's)")
    cs.add_argument("--config", help="TOML config file (see configs/)")
    cs.add_argument("--resume", metavar="RUN_DIR", help="show the saved config of the run in RUN_DIR")
    cs.add_argument("overrides", nargs="*", metavar="[CONFIG.toml] [KEY] [KEY=VALUE]",
                    help="a TOML config (like --config), a dotted key to show (e.g. rl.lr; a section shows all "
                         "its keys) and/or config overrides")
    cs.set_defaults(out=None)


def _add_audit(sub) -> None:
    a = sub.add_parser("audit", help="check a finished or interrupted run offline: tokens, ledgers, groups, "
                       "advantages, checkpoints")
    a.add_argument("run", metavar="RUN_DIR", help="the run directory (a train/quickstart --out)")


def _add_compare(sub) -> None:
    c = sub.add_parser("compare", help="paired held-out change between two evaluations of the same tasks, per "
                       "source, with its standard error")
    c.add_argument("before", metavar="BEFORE.jsonl", help="an evaluation's attempts (RUN/eval/baseline.jsonl, an "
                   "`rlonce eval` --out's eval/eval.jsonl, ...)")
    c.add_argument("after", metavar="AFTER.jsonl", help="another evaluation of the same tasks (RUN/eval/final.jsonl)")


def _add_view(sub) -> None:
    v = sub.add_parser("view", help="a local web page to debug a run: steps, groups, sequences, tokens, plots")
    v.add_argument("run", metavar="RUN_DIR", help="the run directory (a train/quickstart --out)")
    v.add_argument("--port", type=_int(0, 65535), default=8470,
                   help="port, 0..65535 (default 8470; 0 picks a free one)")
    v.add_argument("--host", type=_host, default="127.0.0.1",
                   help="loopback bind address: 127.0.0.1 (default), ::1 or localhost; others are refused")


def _add_doctor(sub) -> None:
    d = sub.add_parser("doctor", help="check this machine for what the configured job needs, with the fix for each")
    d.add_argument("--config", help="TOML config file of the job to check for (default: the quickstart job)")
    d.add_argument("--resume", metavar="RUN_DIR", help="check for the job of the run in RUN_DIR")
    d.add_argument("overrides", nargs="*", metavar="[CONFIG.toml] KEY=VALUE",
                   help="a TOML config (like --config) and/or config overrides")
    d.set_defaults(out=None)


DOMAIN_VERBS = ("tasks", "probe")
"""Verbs whose arguments depend on the domains: their parsers load the registry."""


def _parser(domains: bool | list[str] = True) -> argparse.ArgumentParser:
    """The parser; ``domains``: also each domain's own verbs and flags (loads the registry), and
    those of the plugins a list names by import string (``package.module:DOMAIN``)."""
    ap = _Parser(prog="rlonce", description="Agentic RL post-training, CPU-first.")
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")
    known = []
    if domains is not False:
        from rlonce.cli.domain_commands import known_domains

        known = known_domains([] if domains is True else domains)
    distill = partial(_add_train, verb="distill",
                      help="on-policy distillation (MOPD2) of a student from per-source teachers: a config with "
                           "distill.teacher or [[sources]] teachers (docs/distillation.md)")
    for add in (_add_quickstart, _add_train, distill, _add_eval, _add_serve, partial(_add_tasks, domains=known),
                partial(_add_probe, domains=known), _add_grade, _add_config, _add_doctor, _add_audit, _add_compare,
                _add_view, _add_domains):
        add(sub)
    return ap


def parse_args(argv: list[str]) -> argparse.Namespace:
    plugins = [a for a in argv[1:3] if ":" in a and not a.startswith("-")]  # probe X, tasks build X
    parser = _parser(domains=plugins if argv[:1] and argv[0] in DOMAIN_VERBS else False)
    args, extra = parser.parse_known_args(argv)
    if extra:  # KEY=VALUE overrides after options that follow another positional (argparse stops there)
        if not hasattr(args, "overrides") or any("=" not in x or x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    for name, value in vars(args).items():  # paths and names: a control character is a typo or an attack
        if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
            parser.error(f"--{name.replace('_', '-')} {value!r} holds a control character (a newline, a tab, ...): "
                         "pass it without one")
    if getattr(args, "mode", None):
        args.overrides = [*args.overrides, f"rollout.mode={args.mode}"]
    if getattr(args, "executor", None):
        args.overrides = [*args.overrides, f"executor={args.executor}"]
    return args
