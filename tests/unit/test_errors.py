"""The error family: one base for user-facing errors, causes kept, our own bugs told apart."""

import ast
import importlib
import json
from pathlib import Path

import pytest

from rlonce import errors
from rlonce.errors import RlonceError, cause_of, is_internal

SRC = Path(errors.__file__).resolve().parent
USER_FACING = [
    "rlonce.errors:UsageError", "rlonce.errors:PackError", "rlonce.config:ConfigError",
    "rlonce.model.loader:ModelLoadError", "rlonce.sandbox.base:SandboxError", "rlonce.sandbox.bwrap:BubblewrapMissing",
    "rlonce.sandbox.seccomp:SeccompUnavailable", "rlonce.train.checkpoint:NoCheckpoint",
    "rlonce.train.checkpoint:CheckpointError", "rlonce.telemetry.metrics:RunFileError",
    "rlonce.envs.reasoning.tasks:TaskSpecError", "rlonce.envs.code.packages:PackageError",
    "rlonce.engine.base:BackendError", "rlonce.engine.base:BackendMissing",
]


@pytest.mark.parametrize("name", USER_FACING)
def test_every_user_facing_error_is_an_rlonce_error(name):
    module, cls = name.split(":")
    assert issubclass(getattr(importlib.import_module(module), cls), RlonceError)


def test_each_error_class_is_defined_once_and_the_cli_catches_the_base():
    defined: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception")):
                defined.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    assert {k: v for k, v in defined.items() if len(v) > 1} == {}
    cli = ast.parse((SRC / "cli" / "__init__.py").read_text())
    caught = {ast.unparse(h.type) for h in ast.walk(cli) if isinstance(h, ast.ExceptHandler) and h.type is not None
              and any(isinstance(n, ast.Return) and getattr(n.value, "value", None) == 2 for n in ast.walk(h))}
    assert "RlonceError" in caught


def _raise_outside_rlonce():
    return json.loads(json.dumps({}))["missing"]  # not rlonce code: this test file


def test_is_internal_tells_our_bugs_from_library_and_user_errors():
    from rlonce.core.records import sequence_from_dict

    with pytest.raises(KeyError) as ours:
        sequence_from_dict({})  # a KeyError raised inside rlonce's own code
    assert is_internal(ours.value)
    with pytest.raises(KeyError) as theirs:
        _raise_outside_rlonce()
    assert not is_internal(theirs.value)  # raised by a frame outside the package
    with pytest.raises(ValueError) as lib:
        json.loads("{")
    assert not is_internal(lib.value)  # not one of the bug types
    assert not is_internal(errors.UsageError("bad flag"))


def test_cause_is_one_bounded_line():
    assert cause_of(ConnectionError("refused")) == "ConnectionError: refused"
    long = cause_of(RuntimeError("x\n" * 1000))
    assert "\n" not in long and len(long) == errors.CAUSE_CHARS and long.endswith("…")


def test_a_refused_resume_names_what_changed_in_the_code():
    """Same commit with uncommitted edits: the digests and "uncommitted changes", never the commit twice."""
    from rlonce.recipes.provenance import _code_label

    was = {"git_commit": "a" * 40, "source_sha256": "1" * 64}
    assert _code_label(was, {"git_commit": "a" * 40, "source_sha256": "2" * 64}) == \
        f"source digest {'1' * 12} -> {'2' * 12} (uncommitted changes on commit {'a' * 12})"
    assert _code_label(was, {"git_commit": "b" * 40, "source_sha256": "2" * 64}) == f"commit {'a' * 12} -> {'b' * 12}"
    assert _code_label({"source_sha256": "1" * 64}, {"git_commit": None, "source_sha256": "3" * 64}) == \
        f"source digest {'1' * 12} -> {'3' * 12}"
