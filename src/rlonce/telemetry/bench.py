"""Small helpers the benchmarks share: a Markdown table, a paired bar chart, and a git revision's
source tree to measure beside the working tree's."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path


class SourceError(RuntimeError):
    """A revision's source tree could not be exported (not a git checkout, unknown revision)."""


def source_of(rev: str, paths: tuple[str, ...] = ("src",), repo: Path | None = None) -> tuple[Path, str]:
    """Export ``paths`` (folders of the checkout) of git revision ``rev`` of ``repo`` (default: this
    checkout) into a new temporary folder; ``(that folder, the full commit id)``. Put its ``src``
    first on ``PYTHONPATH`` of a child process to run that revision's ``rlonce`` beside this tree's
    (the caller removes the folder when done)."""
    repo = repo or Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        why = ((getattr(e, "stderr", "") or str(e)).strip().splitlines() or ["git failed"])[-1]
        raise SourceError(f"cannot resolve revision {rev!r} in {repo}: {why}; pass a commit, tag or branch of "
                          "this checkout") from e
    into = Path(tempfile.mkdtemp(prefix=f"rlonce-src-{commit[:10]}-"))
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit, *paths], stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as t:
            t.extractall(into, filter="data")
    return into, commit


def write_table(path: Path, header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    table = "\n".join(lines)
    path.write_text(table + "\n")
    return table


def paired_bars(path: Path, names: list[str], series: dict[str, list[float]], *, ylabel: str, title: str,
                log: bool = True) -> None:
    """One group of bars per name, one bar per series (e.g. sandboxed vs bare)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(7.0, 0.3 + 0.9 * len(names)), 3.4), dpi=100)
    width = 0.8 / len(series)
    for k, (label, values) in enumerate(series.items()):
        offset = (k - (len(series) - 1) / 2) * width
        ax.bar([x + offset for x in range(len(names))], values, width, label=label)
    ax.set_xticks(list(range(len(names))), names)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
