"""Small helpers the benchmarks share: a Markdown table and a paired bar chart."""

from __future__ import annotations

from pathlib import Path


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

    fig, ax = plt.subplots(figsize=(7, 3.4), dpi=100)
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
