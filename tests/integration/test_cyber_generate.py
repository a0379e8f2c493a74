"""Generated cyber targets: seeded C sources whose every planted bug, compiled with the real
sanitizers and run in the real bubblewrap oracle, reports exactly its manifest's type and
function, and whose well-formed records run clean."""

import asyncio
import json
from collections import Counter

import pytest

from rlonce import cli
from rlonce.envs.cyber.bugs import TEMPLATES
from rlonce.envs.cyber.build import compile_target, target_names
from rlonce.envs.cyber.generate import generate, target_name
from rlonce.envs.cyber.oracle import run_input


def test_generation_is_seeded_and_names_are_distinct():
    assert generate(3, seed=5) == generate(3, seed=5)
    assert generate(3, seed=5)[1] != generate(3, seed=6)[1]
    names = [target_name(i, seed=0) for i in range(128)]
    assert len(set(names)) == 128 and not set(names) & set(target_names())
    with pytest.raises(ValueError, match="at most 128"):
        target_name(128)
    name, source, bugs = generate(0, seed=0)
    assert len(bugs) == 8 and len({b["function"] for b in bugs}) == 8
    for b in bugs:  # the PoC is one record: magic, tag, length, value; the tag sits in the handler table
        poc = bytes.fromhex(b["poc_hex"])
        assert poc[:4].decode() == name[:4].upper() and poc[5] == len(poc) - 6
        assert f"{{ '{chr(poc[4])}', {b['function']} }}," in source
        assert b["summary"] not in source
    kinds = Counter(b["type"] for i in range(24) for b in generate(i, seed=0)[2])
    assert len(kinds) == len(TEMPLATES) == 12 and min(kinds.values()) >= 10  # one type per template


@pytest.mark.sandbox
@pytest.mark.clang
def test_every_template_reports_its_type_in_its_function_and_benign_records_run_clean(tmp_path):
    name, source, bugs = generate(0, seed=11, bugs=len(TEMPLATES))
    assert len(bugs) == 12
    (tmp_path / f"{name}.c").write_text(source)
    compile_target(tmp_path / f"{name}.c", tmp_path / name)
    magic = bytes.fromhex(bugs[0]["poc_hex"])[:4]

    async def runs():
        pocs = [run_input(tmp_path / name, bytes.fromhex(b["poc_hex"])) for b in bugs]
        benign = magic + b"".join(bytes.fromhex(b["benign_hex"]) for b in bugs)
        return await asyncio.gather(*pocs, run_input(tmp_path / name, benign), run_input(tmp_path / name, b"XXXX"))

    *hits, clean, bad_magic = asyncio.run(runs())
    for b, run in zip(bugs, hits):
        assert run.report is not None, b["id"]
        assert (run.report.kind, run.report.top_frame({f"{name}.c"}).function) == (b["type"], b["function"])
    assert clean.report is None and clean.exit_code == 0 and not clean.timed_out
    assert bad_magic.report is None and bad_magic.exit_code == 1


@pytest.mark.sandbox
@pytest.mark.clang
def test_cli_builds_and_validates_a_generated_pack(tmp_path, capsys):
    out = tmp_path / "p"
    assert cli.main(["tasks", "build", "cyber", "--out", str(out), "--targets", "none", "--generated", "1",
                     "--seed", "3", "--quiet"]) == 0
    assert "wrote 8 tasks from 1 targets" in capsys.readouterr().out
    assert json.loads((out / "pack.json").read_text())["generated"] == {"count": 1, "seed": 3, "handlers": 8}
    assert cli.main(["tasks", "validate", str(out), "--reruns", "1", "--quiet"]) == 0
    assert "8 of 8 tasks validated over 1 targets" in capsys.readouterr().out
    easy = tmp_path / "easy"  # the easy tier: two handlers a target, each task naming its function
    assert cli.main(["tasks", "build", "cyber", "--out", str(easy), "--targets", "none", "--generated", "1",
                     "--seed", "3", "--handlers", "2", "--quiet"]) == 0
    assert "wrote 2 tasks from 1 targets" in capsys.readouterr().out
    [target] = json.loads((easy / "pack.json").read_text())["targets"]
    source = (easy / "targets" / target / f"{target}.c").read_text()
    table = source.split("handlers[] = {")[1].split("};")[0]
    tasks = json.loads((easy / "tasks.json").read_text())
    assert table.count("{ '") == 2 and all(t["function"] in table and t["target"] == target for t in tasks)
    assert cli.main(["tasks", "build", "cyber", "--out", str(tmp_path / "q"), "--targets", "none",
                     "--generated", "0"]) == 2
    assert "builds nothing" in capsys.readouterr().err
