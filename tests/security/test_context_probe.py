"""The context grader against its shortcut routes (``rlonce.envs.context.probe``) on 200 held-out
tasks: the expert's reply earns reward on every task, the same reply written unusually too, and
every route — the real-world answer from memory, the superseded rule, another value, the format
without the content, a refusal, the whole context sent back — earns nothing."""

import json

from rlonce import cli
from rlonce.config.domains import ProbeRequest
from rlonce.envs.context import ContextOptions
from rlonce.envs.context.probe import ROUTES, probe, run_probe
from rlonce.envs.context.tasks import make_task

HELDOUT = 200


def _check(report: dict, tasks: int) -> None:
    assert report["reference"] == {"tasks": tasks, "rewarded": tasks, "passed": tasks}
    assert report["unusual"] == {"tasks": tasks, "rewarded": tasks, "passed": tasks}
    for name in ROUTES:
        assert report[name]["tasks"] > 0 and report[name]["rewarded"] == 0, (name, report[name])


def test_every_route_earns_nothing_and_the_controls_everything_on_200_heldout_tasks():
    report = run_probe(ContextOptions(), ProbeRequest(tasks=HELDOUT))
    _check(report, HELDOUT)
    assert report["families"] == {"rules": 50, "document": 50, "retention": 50, "listing": 50}
    # each route applies where its shortcut exists
    assert report["memory"]["tasks"] == report["memory_and_answer"]["tasks"] == 50  # documents
    assert report["content_not_format"]["tasks"] == 100  # rules and documents
    assert 15 < report["first_rule"]["tasks"] < 35  # the rules tasks whose rule changed
    assert all(report[n]["tasks"] == HELDOUT for n in ("distractor", "both", "format_not_content", "refuse",
                                                       "copy_context"))
    # the memory route fails on the negative item, not only on the missing answer
    assert report["failed_items"]["memory_and_answer"] == {"document/lacks (negative)": 50}


def test_the_medium_tier_and_the_mean_reward():
    tasks = [make_task("heldout", i, length="medium") for i in range(40)]
    _check(probe(tasks), 40)
    mean = probe(tasks, reward="mean")  # a share of the items: routes earn some reward, never a pass
    assert mean["reference"]["passed"] == 40 and all(mean[n]["passed"] == 0 for n in ROUTES)
    assert mean["refuse"]["rewarded"] == 40  # the negative items pass for a refusal: why 'all' is the default


def test_rlonce_probe_context_prints_the_report_with_hostile_input(capsys):
    assert cli.main(["probe", "context", "--tasks", "20", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reference"]["rewarded"] == 20 and report["refuse"]["rewarded"] == 0
    assert report["hostile_input"]["infra"] == 0 and report["hostile_input"]["passed"] == 0
    assert cli.main(["probe", "context", "--tasks", "4", "--routes", "memory,refuse", "--no-hostile"]) == 0
    out = capsys.readouterr().out
    assert "memory" in out and "copy_context" not in out and "every route failed its items" in out
    assert cli.main(["probe", "context", "--routes", "nope", "--no-hostile"]) == 2
    assert "unknown probe route(s) nope; known: memory," in capsys.readouterr().err
