"""``rlonce.engine.fast.native``'s per-machine cache, with the real compiler behind a wrapper that logs
each command line (and, given ``RLONCE_TEST_NO_BUILD``, refuses anything but ``--version``):

- a second process, and a Ray actor, load the first one's build without compiling;
- a library that does not match its recorded SHA-256 is rebuilt in place;
- a cache directory others can write, or a cached library another uid owns, is refused with one
  logged line, and the library is built privately (nothing written to the cache).
"""

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import slack

from rlonce.engine.fast import native

pytestmark = pytest.mark.skipif(native.compiler() is None, reason=native.NO_COMPILER)

WRAPPER = """#!/bin/sh
echo "$*" >> "{log}"
if [ -n "$RLONCE_TEST_NO_BUILD" ] && [ "$1" != "--version" ]; then echo "asked to build: $*" >&2; exit 1; fi
exec "{cc}" "$@"
"""

PROBE = """
import torch
from rlonce.engine.fast import native
k = native.kernel()
if not isinstance(k, str):
    gate = torch.linspace(-4, 4, 40)
    want = torch.nn.functional.silu(gate) * 2
    assert torch.allclose(native.silu_mul(k, gate, torch.full((40,), 2.0)), want, atol=1e-6)
print(k if isinstance(k, str) else k.where)
"""
"""Run in a fresh process: how it got the kernels, after one checked call."""


def _where(found) -> str:
    if isinstance(found, str):
        pytest.skip(f"no native kernels here: {found}")
    return found.where


def _builds(log: Path) -> list[str]:
    """The wrapper's command lines that asked for more than the compiler's version."""
    return [line for line in log.read_text().splitlines() if line != "--version"]


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == native.__name__]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache built once for the module by this process: (compiler wrapper, its log, cache root, library)."""
    root = tmp_path_factory.mktemp("native")
    cc, log = root / "bin" / "cc", root / "cc.log"
    cc.parent.mkdir()
    cc.write_text(WRAPPER.format(log=log, cc=native.compiler()))
    cc.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CC", str(cc))
        mp.setenv("RLONCE_CACHE", str(root / "cache"))
        mp.delenv("RLONCE_TEST_NO_BUILD", raising=False)
        where = _where(native._load())
    (lib,) = (root / "cache" / "native").glob("step-*.so")
    assert where == f"built into the cache at {lib}"
    return cc, log, root / "cache", lib


@pytest.fixture
def env(built, monkeypatch):
    """This process's environment pointed at the module's wrapper and cache."""
    cc, _, cache, _ = built
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("RLONCE_CACHE", str(cache))
    monkeypatch.delenv("RLONCE_TEST_NO_BUILD", raising=False)
    return built


def test_a_second_process_loads_the_first_ones_build_without_compiling(env):
    cc, log, cache, lib = env
    assert (cache / "native").stat().st_mode & 0o777 == 0o700
    assert lib.stat().st_mode & 0o777 == 0o600 and lib.stat().st_uid == os.geteuid()
    assert lib.with_suffix(".sha256").read_text() == _sha256(lib) + "\n"
    assert sorted(p.name for p in lib.parent.iterdir()) == [lib.with_suffix(".sha256").name, lib.name]  # no leftovers
    before = _builds(log)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=slack(300),
                          env={**os.environ, "RLONCE_TEST_NO_BUILD": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"loaded from the cache at {lib}"
    assert _builds(log) == before  # it asked the compiler its version (the key), nothing more


def test_a_library_that_does_not_match_its_sha256_is_rebuilt(env, tmp_path, monkeypatch, caplog):
    cc, log, cache, built_lib = env
    shutil.copytree(cache, tmp_path / "cache")
    monkeypatch.setenv("RLONCE_CACHE", str(tmp_path / "cache"))
    lib = tmp_path / "cache" / "native" / built_lib.name
    good = lib.read_bytes()
    cut = tmp_path / "cut.so"
    cut.write_bytes(good[: len(good) // 2])  # a new file renamed over it: a library this process mapped stays whole
    cut.chmod(0o600)
    os.replace(cut, lib)
    before = len(_builds(log))
    with caplog.at_level(logging.INFO, logger=native.__name__):
        where = _where(native._load())
    assert where == f"built into the cache at {lib}"
    assert _lines(caplog) == [
        f"native kernels: {lib} does not match its recorded SHA-256; rebuilding it"]
    assert len(_builds(log)) == before + 1
    assert lib.with_suffix(".sha256").read_text() == _sha256(lib) + "\n" and lib.stat().st_size > len(good) // 2


@pytest.mark.parametrize("spoil", ["world-writable directory", "library of another uid"])
def test_a_cache_others_can_change_is_refused_and_the_build_is_private(env, tmp_path, monkeypatch, caplog, spoil):
    cc, log, _, built_lib = env
    monkeypatch.setenv("RLONCE_CACHE", str(tmp_path / "cache"))
    where = tmp_path / "cache" / "native"
    where.mkdir(parents=True, mode=0o700)
    if spoil == "world-writable directory":
        where.chmod(0o777)
        why = "it is world-writable"
    else:
        if os.geteuid() != 0:
            pytest.skip("making a file another uid's needs root")
        planted = where / built_lib.name  # the key does not depend on the cache's place
        planted.write_bytes(b"not a library")
        planted.with_suffix(".sha256").write_text(_sha256(planted) + "\n")
        os.chown(planted, 4242, -1)
        why = f"{planted.name} belongs to uid 4242, not {os.geteuid()}"
    before = sorted(where.iterdir())
    with caplog.at_level(logging.INFO, logger=native.__name__):
        got = _where(native._load())
    assert _lines(caplog) == [
        f"native kernels: not using the cache at {where} ({why}); building privately"]
    assert got == f"built privately (the cache at {where} was not used: {why})"
    assert sorted(where.iterdir()) == before  # nothing written into a cache that was refused


@pytest.mark.slow
def test_a_ray_actor_loads_the_drivers_build_without_compiling(env, tmp_path):
    """Marked slow: it starts a Ray instance of its own (several seconds here) for one actor."""
    ray = pytest.importorskip("ray")
    from rlonce.dist.cluster import RAY_SYSTEM_CONFIG, ray_temp_dir

    cc, log, cache, lib = env
    before = _builds(log)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _system_config=RAY_SYSTEM_CONFIG,
             _temp_dir=str(ray_temp_dir(tmp_path / "ray")))
    try:
        @ray.remote
        class Probe:
            def where(self) -> str:
                found = native.kernel()
                return found if isinstance(found, str) else found.where

        actor = Probe.options(runtime_env={"env_vars": {
            "CC": str(cc), "RLONCE_CACHE": str(cache), "RLONCE_TEST_NO_BUILD": "1"}}).remote()
        assert ray.get(actor.where.remote(), timeout=slack(300)) == f"loaded from the cache at {lib}"
    finally:
        ray.shutdown()
    assert _builds(log) == before
