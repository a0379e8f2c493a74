"""Hack probes of the context items: shortcut replies a policy could try, each graded by the task's
own items (``env.grade_reply``, what the environment's ``grade`` runs).

Every route must earn reward 0 on every task it applies to; the reference (the scripted expert's
reply) and the control must earn 1 on every task.

- ``memory``: the real-world fact instead of the document's, in the expert's form and citation.
- ``memory_and_answer``: the document's answer with the real-world one beside it.
- ``first_rule``: the right value under the rule the conversation began with, not the latest one.
- ``distractor``: the value the context gives for something else (another note, person, passage
  or listing line; the superseded value after a correction), in the expert's form.
- ``both``: the right value and the distractor together ("A or B").
- ``format_not_content``: every rule obeyed, a wrong value.
- ``content_not_format``: the right value in a plain, chatty sentence that ignores the rules (and,
  for a document, the citation).
- ``refuse``: "I cannot answer that from the information given."
- ``copy_context``: the whole system prompt and message sent back.

The control ``unusual`` is the reference written unusually: extra spaces and blank lines, lower
case where no rule sets the case, the citation first and in lower case, a JSON object indented in a
Markdown fence, ``*`` bullets with blank lines between.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from rlonce.envs.context.env import grade_reply
from rlonce.envs.context.expert import write
from rlonce.envs.context.items import CITATION, grade_items
from rlonce.envs.context.record import ContextTask
from rlonce.envs.context.tasks import make_task
from rlonce.envs.context.vocab import CHATTY_TAIL

REFUSAL = "I cannot answer that from the information given."


def content_not_format(task: ContextTask) -> str | None:
    if task.family == "rules":
        return task.sentence.format(task.answer) + CHATTY_TAIL
    if task.family == "document":
        return " ".join(CITATION.sub("", task.sentence.format(task.answer)).split()).replace(" .", ".")
    return None


ROUTES: dict[str, Callable[[ContextTask], str | None]] = {
    "memory": lambda t: write(t, t.memory) if t.memory else None,
    "memory_and_answer": lambda t: write(t, f"{t.answer} (in the real world {t.memory})") if t.memory else None,
    "first_rule": lambda t: write(t, t.answer, t.first_rules) if t.first_rules else None,
    "distractor": lambda t: write(t, t.distractor),
    "both": lambda t: write(t, f"{t.answer} or {t.distractor}"),
    "format_not_content": lambda t: write(t, t.decoy),
    "content_not_format": content_not_format,
    "refuse": lambda t: REFUSAL,
    "copy_context": lambda t: f"{t.system}\n\n{t.prompt}",
}
"""Shortcut routes: each gives a reply on the tasks it fits (None elsewhere); every one must earn 0."""


def unusual(task: ContextTask) -> str:
    """The reference written unusually (a positive control)."""
    kinds = {r.kind: r for r in task.rules}
    text = write(task, task.answer)
    if "json" in kinds:
        name_key, name, value_key = kinds["json"].arg
        text = "```json\n" + json.dumps({name_key: name, value_key: task.answer}, indent=2) + "\n```"
    if "bullets" in kinds:
        text = "\n\n".join("*   " + line.removeprefix("- ") for line in text.splitlines())
    if task.family == "document":
        cite = CITATION.search(text).group(0)
        text = f"{cite.lower()}  " + " ".join(text.replace(cite, "").split()).replace(" .", ".")
    if "upper" not in kinds and "lower" not in kinds:
        text = text.lower()
    return "\n  " + text.replace(" ", "  ") + "  \n\n"


CONTROLS: dict[str, Callable[[ContextTask], str | None]] = {"unusual": unusual}
"""Correct replies besides the reference: every one must earn 1."""


def probe(tasks: list[ContextTask], *, routes: list[str] | None = None, reward: str = "all") -> dict:
    """Every route on every task it applies to, the reference and the controls on all: per route the
    tasks tried, rewarded (reward > 0) and passed; the reference's tasks per family; and for each
    route, the items that failed it most often (``failed_items``: family/check, its three commonest)."""
    chosen = {n: r for n, r in ROUTES.items() if routes is None or n in routes}
    report: dict[str, dict] = {}
    failed: dict[str, dict[str, int]] = {}
    families: dict[str, int] = {}
    for task in tasks:
        families[task.family] = families.get(task.family, 0) + 1
        for name, route in {"reference": lambda t: write(t, t.answer), **CONTROLS, **chosen}.items():
            reply = route(task)
            if reply is None:
                report.setdefault(name, {"tasks": 0, "rewarded": 0, "passed": 0})
                continue
            grade = grade_reply(task, reply, reward)
            r = report.setdefault(name, {"tasks": 0, "rewarded": 0, "passed": 0})
            r["tasks"] += 1
            r["rewarded"] += int(grade.reward > 0)
            r["passed"] += int(grade.passed)
            mine = failed.setdefault(name, {})
            for item, ok in grade_items(task.items, reply):
                if not ok:
                    key = f"{task.family}/{item.check}" + (" (negative)" if item.kind == "negative" else "")
                    mine[key] = mine.get(key, 0) + 1
    out = {n: report.get(n, {"tasks": 0, "rewarded": 0, "passed": 0}) for n in ("reference", *CONTROLS, *chosen)}
    out["families"] = families
    out["failed_items"] = {n: dict(sorted(f.items(), key=lambda kv: -kv[1])[:3]) for n, f in failed.items() if f}
    return out


def format_report(report: dict) -> str:
    routes = {n: r for n, r in report.items() if isinstance(r, dict) and "rewarded" in r}
    lines = [f"{'route':20} {'tasks':>6} {'rewarded':>9} {'passed':>7}"]
    lines += [f"{name:20} {r['tasks']:6} {r['rewarded']:9} {r['passed']:7}" for name, r in routes.items()]
    lines.append("families: " + ", ".join(f"{f} {n}" for f, n in report.get("families", {}).items()))
    good = ("reference", *CONTROLS)
    bad = [n for n, r in routes.items() if n not in good and r["rewarded"]]
    missed = [n for n, r in routes.items() if n in good and r["passed"] < r["tasks"]]
    lines.append("every route failed its items" if not bad else f"routes that earned reward: {', '.join(bad)}")
    if missed:
        lines.append(f"controls that missed reward: {', '.join(missed)}")
    return "\n".join(lines)


def run_probe(options, request) -> dict:
    """``rlonce probe context`` (``rlonce.config.domains.Probe.run``): ``probe`` on ``request.tasks``
    held-out tasks of the configured families and length, with the request's routes."""
    unknown = [r for r in request.routes or [] if r not in ROUTES]
    if unknown:
        raise ValueError(f"unknown probe route(s) {', '.join(unknown)}; known: {', '.join(ROUTES)}")
    families = tuple(options.context_families)
    tasks = [make_task("heldout", i, families, options.context_length) for i in range(request.tasks)]
    return probe(tasks, routes=request.routes, reward=options.context_reward)
