"""The CLI verbs that reach domains through the registry (``rlonce.config.domains``): ``tasks
build|validate|filter``, ``probe <domain>`` and ``domains``, and the output-folder check every verb
shares. A domain offers these on its ``DomainSpec`` (``packs``, ``probe``); the handlers live in its
own folder and are imported when the verb runs, so no domain is named here. A ``ValueError`` a
domain's handler raises is the user's to fix and becomes one ``UsageError`` line.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from rlonce.errors import RlonceError, UsageError


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


@contextmanager
def user_errors():
    """A ``ValueError`` from a domain's handler (an unknown route, target or package) as one line."""
    try:
        yield
    except RlonceError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None


def model_from(model, args, names: tuple[str, ...], what: str):
    """``model`` (a domain's options or settings) from the flags ``names`` that were given."""
    from pydantic import ValidationError

    try:
        return model(**{n: getattr(args, n) for n in names if hasattr(args, n)})
    except ValidationError as e:
        err = e.errors()[0]
        where = f"--{str(err['loc'][0]).replace('_', '-')}: " if err["loc"] else ""
        raise UsageError(f"{what}: {where}{err['msg'].removeprefix('Value error, ')}") from None


def known_domains(named: list[str] = ()) -> list:
    """``(name, spec)`` of every domain the registry knows that loads (built-ins, then installed
    plugins; one that does not load is left out here, ``rlonce domains`` says why), then of the
    plugins ``named`` by import string (``package.module:DOMAIN``; one that does not load is an error)."""
    from rlonce.config.domains import BUILTIN, domain_names, load_domain

    out = []
    for name in domain_names():
        try:
            out.append((name, load_domain(name)))
        except RlonceError:
            if name in BUILTIN:
                raise
    return out + [(name, load_domain(name)) for name in named]


def domains_with(offers) -> list[str]:
    """The names of the domains (that load) whose spec ``offers(spec)`` holds."""
    return [n for n, s in known_domains() if offers(s)]


def pack_domain(pack: Path):
    """``(name, spec)`` of the domain that wrote ``pack``: its ``pack.json``'s ``"domain"``, or for a
    pack written before packs recorded it, the one domain whose pack tools recognise the manifest."""
    from rlonce.config.domains import load_domain
    from rlonce.envs.packs import read_json_object

    manifest_file = Path(pack) / "pack.json"
    if not manifest_file.is_file():
        raise UsageError(f"{pack} is not a task pack (no pack.json); build one with `rlonce tasks build DOMAIN "
                         f"--out DIR` (DOMAIN: {', '.join(domains_with(lambda s: s.packs and s.packs.build))})")
    manifest = read_json_object(manifest_file, "rebuild the pack with `rlonce tasks build`")
    name = manifest.get("domain")
    if name is None:
        found = domains_with(lambda s: s.packs and s.packs.recognises(manifest))
        if len(found) != 1:
            raise UsageError(f"{manifest_file} names no domain; add its domain as \"domain\": NAME")
        name = found[0]
    if not isinstance(name, str):
        raise UsageError(f"{manifest_file}: \"domain\" is {name!r}, not a domain name; rebuild the pack")
    return name, load_domain(name)


def tasks_build(args) -> int:
    """``rlonce tasks build DOMAIN --out DIR``: the domain's ``PackTools.build``."""
    from rlonce.config.domains import load_domain, resolve

    spec = load_domain(args.domain)
    settings = model_from(spec.packs.build_settings, args, args.setting_flags, f"tasks build {args.domain}")
    build = resolve(spec.packs.build, f"domain {args.domain!r}: tasks build")
    out = writable_dir(args.out)
    with user_errors():
        text = build(out, settings, progress=not args.quiet)
    print(f"{text}; next: rlonce tasks validate {out}")
    return 0


def tasks_validate(args) -> int:
    """``rlonce tasks validate DIR``: the quality gates of the domain that wrote the pack."""
    from rlonce.config.domains import resolve

    pack = Path(args.pack)
    name, spec = pack_domain(pack)
    if not (spec.packs and spec.packs.validate):
        raise UsageError(f"{pack} is a {name} pack, and the {name} domain has no `tasks validate`")
    validate = resolve(spec.packs.validate, f"domain {name!r}: tasks validate")
    with user_errors():
        report, text = validate(pack, reruns=args.reruns, progress=not args.quiet and not args.json)
    print(json.dumps(report) if args.json else text)
    return 0


def tasks_filter(args) -> int:
    """``rlonce tasks filter DOMAIN --out DIR``: keep the domain's train tasks by measured pass rate
    (``rlonce.recipes.filter``); a domain without tools is sampled through the single-turn arm."""
    from rlonce.config import load_config
    from rlonce.config.domains import load_domain
    from rlonce.recipes.filter import filter_tasks

    spec = load_domain(args.domain)
    out = writable_dir(args.out)
    arms = [] if spec.tools else ["harness.arms=[single-turn]"]
    cfg = load_config(args.config, [f"task.name={args.domain}", *arms, "sft.demos=0", *args.overrides, f"out={out}"])
    with user_errors():
        r = filter_tasks(cfg, args.model, args.tasks, args.k, out, max_pass=args.max_pass, progress=not args.quiet)
    print(f"kept {r['kept_count']} of {r['tasks']} tasks "
          f"(pass rate over {r['k']} samples in (0, {r['max_pass']})); "
          f"histogram {r['pass_rate_histogram']}; next: task.pack={out}")
    return 0


def _routes(text: str | None) -> list[str] | None:
    if not text:
        return None
    if text.strip() == "none":
        return []
    return [r.strip() for r in text.split(",") if r.strip()]


def _probe_judge(kind: str):
    """``--judge``: None, or the rule-based judge (the tests' and CI's)."""
    if kind != "scripted":
        return None
    from rlonce.grading.judge import ScriptedJudge
    from rlonce.grading.scripted import scripted_rules

    return ScriptedJudge(scripted_rules)


def probe(args) -> int:
    """``rlonce probe DOMAIN``: the domain's ``Probe.run`` on the request its flags make, then the
    hostile-input episodes (``show_probe``)."""
    from rlonce.config.domains import ProbeRequest, load_domain, resolve

    spec = load_domain(args.domain)
    what = f"probe {args.domain}"
    options = model_from(spec.options, args, args.option_flags, what)
    settings = model_from(spec.probe.settings, args, args.setting_flags, what)
    record = getattr(args, "record", None)
    if record:
        try:
            Path(record).open("a").close()
        except OSError as e:
            raise UsageError(f"cannot write the probe record {record}: {e.strerror or e}; "
                             "choose another --record path") from None
    given = {k: getattr(args, k) for k in spec.probe.reads if getattr(args, k, None) is not None}
    request = ProbeRequest(**{**given, "routes": _routes(getattr(args, "routes", None)),
                              "record": Path(record) if record else None,
                              "judge": _probe_judge(getattr(args, "judge", "none"))},
                           settings=settings, progress=not args.quiet and not args.json)
    run = resolve(spec.probe.run, f"domain {args.domain!r}: probe")
    with user_errors():
        report = run(options, request)
    return show_probe(args, spec, options, report, resolve(spec.probe.format_report, f"{what}: format_report"))


def show_probe(args, spec, options, report: dict, format_report) -> int:
    """Print a domain probe's report with the hostile-input episodes of ``rlonce.rollout.hostile``
    run on one of the domain's tasks (unless ``--no-hostile``): one JSON object with ``--json``."""
    import asyncio

    if not args.no_hostile:
        from rlonce.rollout.hostile import arms_for, probe_hostile_input

        domain = spec.build(options)
        report["hostile_input"] = asyncio.run(probe_hostile_input(
            domain.env_factory, domain.task("train", 0), arms_for(spec.single_turn, spec.tools)))
    if args.json:
        print(json.dumps(report))
    else:
        from rlonce.rollout.hostile import format_hostile

        print(format_report(report))
        if "hostile_input" in report:
            print(format_hostile(report["hostile_input"]))
    return 0


def _verbs(name: str, spec) -> list[str]:
    packs = spec.packs
    verbs = [f"tasks build {name}"] if packs and packs.build else []
    verbs += ["tasks validate DIR"] if packs and packs.validate else []
    verbs += [f"tasks filter {name}"] if packs and packs.filter else []
    verbs += ["tasks audit DIR", "grade synthesize-rubrics --pack DIR"] if spec.pack_audit else []
    return verbs + ([f"probe {name}"] if spec.probe else [])


def describe_domain(name: str, origin: str) -> dict:
    """What ``rlonce domains`` shows of one domain (``error`` instead when it does not load)."""
    from rlonce.config.domains import load_domain

    try:
        spec = load_domain(name)
    except RlonceError as e:
        return {"name": name, "origin": origin, "error": str(e)}
    options = spec.options()
    return {"name": name, "origin": origin, "summary": spec.summary, "expert": spec.has_expert,
            "single_turn": spec.single_turn, "tools": spec.tools, "options": options.model_dump(mode="json"),
            "verbs": _verbs(name, spec),
            "needs": [{"name": n.name, "ok": n.ok, "detail": n.detail, "fix": n.fix, "required": n.required}
                      for n in spec.needs(options)]}


def _text(d: dict) -> str:
    pad = " " * 4
    if "error" in d:
        return f"{d['name']}  ({d['origin']}) does not load: {d['error']}"
    kinds = [k for k, on in (("expert", d["expert"]), ("single-turn", d["single_turn"]), ("tools", d["tools"])) if on]
    options = ", ".join(f"{k} = {json.dumps(v)}" for k, v in d["options"].items()) or "none"
    needs = "; ".join(f"{n['name']} {'ok' if n['ok'] else 'missing' if n['required'] else 'note'}"
                      + ("" if n["ok"] else f" ({n['detail']})") for n in d["needs"]) or "nothing"
    return "\n".join([f"{d['name']}  {d['summary']}", f"{pad}{d['origin']}; {', '.join(kinds) or '-'}",
                      f"{pad}options: {options}", f"{pad}verbs: {', '.join(d['verbs']) or 'none'}",
                      f"{pad}needs (default options): {needs}"])


def list_domains(args) -> int:
    """``rlonce domains``: every domain the registry knows, built-ins first; 1 when one does not load."""
    import importlib.metadata

    from rlonce.config.domains import BUILTIN, ENTRY_POINT_GROUP, domain_names

    eps = {e.name: e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    rows = [describe_domain(n, "built in" if n in BUILTIN else
                            f"entry point of {eps[n].dist.name if eps[n].dist else 'an installed package'}")
            for n in domain_names()]
    print(json.dumps(rows) if args.json else "\n".join(_text(d) for d in rows))
    return int(any("error" in d for d in rows))
