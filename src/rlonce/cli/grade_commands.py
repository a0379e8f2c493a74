"""The CLI verbs of offline model grading on a pack: ``tasks audit DIR`` (rollout auditing for
task quality, ``rlonce.recipes.task_audit``) and ``grade synthesize-rubrics --pack DIR`` (GRS rubric
synthesis, ``rlonce.recipes.rubric_synthesis``), for a pack of any domain with offline grading tools
(``DomainSpec.pack_audit``; the pack's domain is its pack.json's). A judge that fails is counted,
never fatal: both finish with exit status 0 and report the failures by category."""

from __future__ import annotations

import json
from pathlib import Path

from rlonce.errors import UsageError


def _judge(args, record: Path):
    """The judge ``--judge`` names: the scripted rule judge, or a model at an endpoint URL."""
    from pydantic import ValidationError

    from rlonce.config.grading import JudgeConfig
    from rlonce.grading.build import build_judge

    try:
        if args.judge == "scripted":
            cfg = JudgeConfig(kind="scripted", retries=args.judge_retries, agentic=args.agentic)
        else:
            cfg = JudgeConfig(kind="endpoint", base_url=args.judge, model=args.judge_model,
                              protocol=args.judge_protocol, api_key_env=args.judge_key_env,
                              timeout_s=args.judge_timeout, max_tokens=args.judge_max_tokens,
                              retries=args.judge_retries, agentic=args.agentic)
    except ValidationError as e:
        msg = e.errors()[0].get("msg", str(e)).removeprefix("Value error, ")
        raise UsageError(f"--judge: {msg}") from None
    return build_judge(cfg, record, name="auditor")


def _agent(args):
    """``--agent``: None for the scripted agents, else a model agent at that endpoint."""
    if args.agent == "scripted":
        return None
    if not args.agent.startswith(("http://", "https://")):
        raise UsageError(f"--agent: {args.agent!r} is neither 'scripted' nor an http(s) URL; give e.g. "
                         "'http://127.0.0.1:8000/sessions/{call}/v1' for `rlonce serve`")
    from rlonce.grading.judge import EndpointJudge
    from rlonce.recipes.task_audit import ModelAgent

    endpoint = EndpointJudge(args.agent, args.agent_model, timeout=args.judge_timeout)
    return ModelAgent(f"{args.agent_model} at {args.agent}", endpoint.send)


def _graded_pack(pack: str, verb: str) -> Path:
    """``pack``, when it exists and its domain (from its pack.json) has offline grading tools
    (``DomainSpec.pack_audit``): checked before a judge is built."""
    from rlonce.recipes.task_audit import pack_audit

    p = Path(pack)
    if not p.exists():
        raise UsageError(f"{verb}: {p} does not exist; pass a pack built with `rlonce tasks build DOMAIN --out DIR` "
                         "and validated with `rlonce tasks validate DIR`")
    pack_audit(p)
    return p


def tasks_audit(args) -> int:
    """``rlonce tasks audit DIR``: audit.json, the audit section of validation.json, a table."""
    from rlonce.recipes.task_audit import RECORD, audit_pack, format_audit

    pack = _graded_pack(args.pack, "tasks audit")
    judge = _judge(args, pack / RECORD)
    report = audit_pack(pack, judge, limit=args.tasks, concurrency=args.concurrency,
                        progress=not args.quiet and not args.json, agent=_agent(args))
    print(json.dumps(report) if args.json else format_audit(report))
    return 0


def synthesize_rubrics(args) -> int:
    """``rlonce grade synthesize-rubrics --pack DIR``: rubrics.json and a summary line."""
    from rlonce.recipes.rubric_synthesis import format_rubrics, synthesize_rubrics

    pack = _graded_pack(args.pack, "grade synthesize-rubrics")
    judge = _judge(args, pack / "rubrics" / "calls.jsonl")
    report = synthesize_rubrics(pack, judge, limit=args.tasks, rollouts=args.rollouts,
                                min_pass_rate=args.min_pass_rate, concurrency=args.concurrency,
                                progress=not args.quiet and not args.json)
    print(json.dumps(report) if args.json else format_rubrics(report))
    return 0


def grade(args) -> int:
    return {"synthesize-rubrics": synthesize_rubrics}[args.action](args)
