"""The real packages code-repair tasks are made from, pinned by version and sdist hash.

Each is a pure-Python package whose source distribution ships its own test suite and runs it in
seconds under a bare interpreter plus pytest. ``fetch`` downloads the sdist from the package
index (``pip download --no-binary``), refuses it unless its SHA-256 matches the pin, and
unpacks it; ``local`` packages (a directory, used by the test suite) skip the download.

The test runner inside the sandbox is the system interpreter (``/usr/bin/python3``) with a
read-only *testbed* directory holding only pytest and its dependencies — never the package
under test — installed once with ``pip install --target``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from rlonce.errors import RlonceError


class PackageError(RlonceError, RuntimeError):
    """A package could not be fetched or does not match its pin."""


@dataclass(frozen=True)
class PackageSpec:
    name: str
    version: str
    sha256: str
    """SHA-256 of the sdist; '' for a local package."""
    import_root: str
    """Directory (relative to the sdist root) that goes on PYTHONPATH."""
    modules: tuple[str, ...]
    """Source files to mutate, relative to the sdist root."""
    tests: tuple[str, ...]
    """Test files or directories, relative to the sdist root."""
    local: str | None = None
    """A directory holding the package tree instead of an sdist (tests use one)."""
    pytest_args: tuple[str, ...] = ()
    test_timeout: float = 60.0
    hide: tuple[str, ...] = field(default=())
    """System paths to cover in the sandbox (a distribution's own copy of this package)."""


PACKAGES: dict[str, PackageSpec] = {p.name: p for p in (
    PackageSpec("cachetools", "8.0.2", "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0", "src",
                ("src/cachetools/__init__.py", "src/cachetools/keys.py", "src/cachetools/func.py"), ("tests",)),
    PackageSpec("toolz", "1.0.0", "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02", ".",
                ("toolz/itertoolz.py", "toolz/functoolz.py", "toolz/dicttoolz.py", "toolz/recipes.py"),
                ("toolz/tests",)),
    PackageSpec("boltons", "26.2.0", "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c", ".",
                ("boltons/strutils.py", "boltons/iterutils.py", "boltons/listutils.py", "boltons/setutils.py",
                 "boltons/mathutils.py", "boltons/dictutils.py", "boltons/queueutils.py"), ("tests",)),
    PackageSpec("inflection", "0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417", ".",
                ("inflection/__init__.py",), ("test_inflection.py",)),
    PackageSpec("isodate", "0.7.2", "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6", "src",
                ("src/isodate/isodates.py", "src/isodate/isotime.py", "src/isodate/isodatetime.py",
                 "src/isodate/isoduration.py", "src/isodate/duration.py", "src/isodate/isotzinfo.py",
                 "src/isodate/isostrf.py"), ("tests",)),
    PackageSpec("tabulate", "0.10.0", "e2cfde8f79420f6deeffdeda9aaec3b6bc5abce947655d17ac662b126e48a60d", ".",
                ("tabulate/__init__.py",), ("test",)),
    PackageSpec("sqlparse", "0.6.1", "ca722573f848ff2d30e40ea30f53a104b7dea7635ea9285891263eb2c58fb6e7", ".",
                ("sqlparse/utils.py", "sqlparse/formatter.py", "sqlparse/filters/reindent.py",
                 "sqlparse/filters/others.py", "sqlparse/sql.py"), ("tests",)),
)}

TESTBED_PACKAGES = ("pytest", "pluggy", "iniconfig", "packaging")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(spec: PackageSpec, cache: Path) -> Path:
    """The unpacked package tree (cached under ``cache``); the sdist hash is checked first."""
    if spec.local is not None:
        return Path(spec.local)
    tree = cache / f"{spec.name}-{spec.version}"
    if (tree / ".rlonce-ok").is_file():
        return tree
    dl = cache / "sdists"
    dl.mkdir(parents=True, exist_ok=True)
    found = [p for p in dl.glob("*.tar.gz") if _sha256(p) == spec.sha256]
    if not found:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet",
                            "--disable-pip-version-check", "-d", str(dl), f"{spec.name}=={spec.version}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise PackageError(f"could not download {spec.name}=={spec.version} from the package index: "
                               f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}")
        found = [p for p in dl.glob("*.tar.gz") if _sha256(p) == spec.sha256]
        if not found:
            raise PackageError(f"{spec.name}=={spec.version}: no downloaded sdist matches the pinned sha256 "
                               f"{spec.sha256[:12]}…; the index served a different file")
    shutil.rmtree(tree, ignore_errors=True)
    tmp = cache / f".unpack-{spec.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(found[0]) as tar:
        tar.extractall(tmp, filter="data")
    (top,) = list(tmp.iterdir())
    top.rename(tree)
    shutil.rmtree(tmp)
    (tree / ".rlonce-ok").write_text(spec.sha256 + "\n")
    return tree


def testbed(cache: Path) -> Path:
    """A directory with pytest and its dependencies only, for the sandbox's interpreter."""
    from importlib.metadata import version

    pins = [f"{p}=={version(p)}" for p in TESTBED_PACKAGES]
    key = hashlib.sha256(" ".join(pins).encode()).hexdigest()[:10]
    dest = cache / f"testbed-{key}"
    if (dest / ".rlonce-ok").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--no-compile", "--target", str(dest), *pins], capture_output=True, text=True)
    if r.returncode != 0:
        raise PackageError(f"could not install the pytest testbed ({', '.join(pins)}): "
                           f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    (dest / ".rlonce-ok").write_text(" ".join(pins) + "\n")
    return dest
