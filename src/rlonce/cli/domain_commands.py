"""The CLI verbs of the cyber, music and general domains (``tasks build/validate cyber``,
``probe cyber``, ``probe music``, ``probe general``), kept apart from ``commands`` so each
domain's imports stay lazy, and the output-folder check every verb shares."""

from __future__ import annotations

from pathlib import Path

from rlonce.errors import UsageError


def writable_dir(path: str) -> Path:
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


def show_probe(args, report: dict, format_report) -> int:
    """Print a domain probe's report with the hostile-input episodes of ``rlonce.rollout.hostile``
    run on one of the domain's tasks (unless ``--no-hostile``): one JSON object with ``--json``."""
    import asyncio
    import json

    if not args.no_hostile:
        from rlonce.config import TaskConfig
        from rlonce.config.domains import load_domain
        from rlonce.envs.domains import domain_for
        from rlonce.rollout.hostile import arms_for, probe_hostile_input

        entry = load_domain(args.domain)
        given = {"pack": args.pack} if "pack" in entry.options.model_fields else {}
        domain = domain_for(TaskConfig(name=args.domain, **given))
        report["hostile_input"] = asyncio.run(probe_hostile_input(
            domain.env_factory, domain.task("train", 0), arms_for(entry.single_turn, entry.tools)))
    if args.json:
        print(json.dumps(report))
    else:
        from rlonce.rollout.hostile import format_hostile

        print(format_report(report))
        if "hostile_input" in report:
            print(format_hostile(report["hostile_input"]))
    return 0


def is_cyber_pack(pack: str) -> bool:
    import json

    f = Path(pack) / "pack.json"
    try:
        return f.is_file() and json.loads(f.read_text()).get("domain") == "cyber"
    except (OSError, ValueError):
        return False


def build_cyber(args) -> int:
    from rlonce.envs.cyber.build import build_pack, require_clang, target_names

    require_clang()
    names = [] if args.targets == "none" else args.targets.split(",") if args.targets else target_names()
    unknown = [n for n in names if n not in target_names()]
    if unknown:
        raise UsageError(f"unknown target(s) {', '.join(unknown)}; shipped targets: {', '.join(target_names())}")
    if not names and not args.generated:
        raise UsageError("--targets none builds nothing; add --generated N")
    out = writable_dir(args.out)
    tasks = build_pack(out, names, generated=args.generated, seed=args.seed, progress=not args.quiet)
    print(f"wrote {len(tasks)} tasks from {len(names) + args.generated} targets to {out}; "
          f"next: rlonce tasks validate {out}")
    return 0


def validate_cyber(args) -> int:
    import json

    from rlonce.envs.cyber.validate import validate_pack

    report = validate_pack(Path(args.pack), reruns=args.reruns, progress=not args.quiet and not args.json)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "validated_ids"}))
    else:
        print(f"{report['validated']} of {report['tasks']} tasks validated over {len(report['targets'])} targets and "
              f"{len(report['types'])} vulnerability types ({', '.join(report['types'])}); dropped: "
              f"{report['dropped'] or 'none'}; report in {Path(args.pack) / 'validation.json'}")
    return 0


def probe_cyber(args) -> int:

    from rlonce.envs.cyber.probe import ROUTES, format_report, probe_pack
    from rlonce.envs.cyber.validate import validated_tasks

    routes = args.routes.split(",") if args.routes else None
    unknown = [r for r in routes or [] if r not in ROUTES]
    if unknown:
        raise UsageError(f"unknown probe route(s) {', '.join(unknown)}; known: {', '.join(ROUTES)}")
    tasks = validated_tasks(Path(args.pack))
    if args.limit:
        tasks = tasks[:: max(1, len(tasks) // args.limit)][: args.limit]
    if not tasks:
        raise UsageError(f"{args.pack} has no validated tasks to probe")
    report = probe_pack(tasks, routes=routes, progress=not args.quiet and not args.json)
    return show_probe(args, report, format_report)


def probe_music(args) -> int:

    from rlonce.envs.music.abc import require_abc2midi
    from rlonce.envs.music.probe import format_report, probe_music

    require_abc2midi()
    report = probe_music(args.tasks, progress=not args.quiet and not args.json, adherence_weight=args.adherence_weight)
    return show_probe(args, report, format_report)


def probe_visual(args) -> int:

    from rlonce.envs.visual.probe import format_report, probe_visual
    from rlonce.envs.visual.render import require_browser

    require_browser()
    report = probe_visual(args.tasks, progress=not args.quiet and not args.json)
    return show_probe(args, report, format_report)


def probe_general(args) -> int:
    import asyncio

    from rlonce.envs.general.probe import ROUTES, format_report, probe
    from rlonce.envs.general.tasks import make_task
    from rlonce.errors import UsageError

    routes = [r.strip() for r in args.routes.split(",") if r.strip() and r.strip() != "none"] if args.routes else None
    if routes is not None and set(routes) - set(ROUTES):
        raise UsageError(f"--routes: unknown {sorted(set(routes) - set(ROUTES))}; known: {', '.join(ROUTES)}")
    tasks = [make_task("heldout", i) for i in range(args.tasks)]
    judge = None
    if args.judge == "scripted":  # the judged items asked of the scripted judge (the tests' and CI's judge)
        from rlonce.grading.judge import ScriptedJudge
        from rlonce.grading.scripted import scripted_rules

        judge = ScriptedJudge(scripted_rules)
    report = asyncio.run(probe(tasks, concurrency=args.concurrency, routes=routes, judge=judge))
    return show_probe(args, report, format_report)
