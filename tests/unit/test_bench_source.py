"""``rlonce.telemetry.bench.source_of``: a git revision's folders exported beside the working tree,
for the benchmarks' ``--against REV`` (a revision measured before this tree, in a child process)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from rlonce.telemetry.bench import SourceError, source_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None,
                                reason="needs a git checkout of the project")


def test_a_revisions_src_is_exported_whole():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    into, commit = source_of("HEAD", ("src", "configs"))
    try:
        assert commit == head
        assert (into / "src" / "rlonce" / "__init__.py").is_file()
        assert (into / "configs" / "tiny.toml").is_file()
        assert not (into / "tests").exists()  # only what was asked for
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{head}:src/rlonce/engine/forward.py"],
                               capture_output=True, text=True, check=True).stdout
        assert (into / "src" / "rlonce" / "engine" / "forward.py").read_text() == shown
    finally:
        shutil.rmtree(into, ignore_errors=True)


def test_an_unknown_revision_is_refused_in_one_line():
    with pytest.raises(SourceError) as e:
        source_of("no-such-revision-anywhere")
    assert "no-such-revision-anywhere" in str(e.value) and "\n" not in str(e.value)
