"""``report.html``: a self-contained page of plots (PNG embedded) and the run's summary table.

Each curve's title is its figure caption only (the image has none, so it reads once), its step
axis has whole-number ticks, and nested summary values (per source, per arm) are tables. A
held-out curve separates its evaluations by kind: baseline and final run on all held-out tasks,
mid-run ones (``eval.every``) on a subset (``eval.during_tasks``), so their points are drawn as
separate series whose legend gives each one's task count (read from ``RUN/eval/*.jsonl``) — a
mid-run point below the baseline is a smaller sample, not necessarily a regression.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from rlonce.telemetry.metrics import read_jsonl

PLOTS = [
    ("reward", "Training reward (mean over the step's sequences)", "reward_mean"),
    ("heldout", "Held-out success (ends: all held-out tasks; between: a subset)", "heldout_success"),
    ("heldout_reward", "Held-out mean reward (a graded domain's score)", "heldout_reward"),
    ("entropy", "Policy entropy (nats / trained token)", "entropy"),
    ("length", "Response length (model tokens / sequence)", "response_tokens_mean"),
    ("step_time", "Step time (s): rollout and train", ("rollout_seconds", "train_seconds")),
    ("mismatch_kl", "Train/inference mismatch: KL(rollout ‖ trainer) per token", "mismatch_kl"),
    ("mismatch_corr", "Train/inference mismatch: correlation of token probabilities", "mismatch_corr"),
    ("clipping", "Clipped or masked share of trained tokens (by objective)",
     ("clipfrac", "clip_pos_low", "clip_pos_high", "clip_neg_low", "clip_neg_high", "correction_capped_frac",
      "correction_masked_frac")),
]


def source_plots(rows: list[dict]) -> list[tuple]:
    """A mixed run's per-source plots: retained share of the trained groups against the target
    share, groups trained, and training success, one line per source."""
    labels = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("src/") and k.endswith("/target_share")})
    if not labels:
        return []
    shares = tuple(f"src/{n}/{k}" for n in labels for k in ("retained_share", "target_share"))
    return [("source_share", "Retained share of the batch per source vs its target", shares),
            ("source_groups", "Groups trained per step per source (0: the source taught nothing that step)",
             tuple(f"src/{n}/retained_groups" for n in labels)),
            ("source_success", "Training success per source", tuple(f"src/{n}/success_rate" for n in labels))]


def grading_plots(rows: list[dict]) -> list[tuple]:
    """A run with model graders (``[grading]``): hack rate per source and audit coverage, judge
    failure and fallback rates with agreement κ, and the cost shares of rollout, grading, training."""
    if not any(k.startswith("grading/") for r in rows for k in r):
        return []
    hack = tuple(sorted({k for r in rows for k in r if k.startswith("grading/hack_rate")}))
    return [("grading_hack", "Hack audit: confirmed / audited, and audit coverage",
             (*hack, "grading/audit_coverage")),
            ("grading_judge", "Judge: failure and parse-failure rate, GAR/GRS fallback rate, agreement κ",
             ("judge_failure_rate", "judge_parse_failure_rate", "grading/gar_fallback_rate",
              "grading/grs_fallback_rate", "grading/kappa")),
            ("grading_cost", "Cost: share of step wall time and of tokens",
             ("cost/rollout_time_share", "cost/grading_time_share", "cost/train_time_share",
              "cost/grading_token_share"))]


def moe_plots(rows: list[dict]) -> list[tuple]:
    """A sparse model's run (``rlonce.model.moe``): expert load per layer (coefficient of variation,
    busiest expert over the mean, share of cold experts) and the share of recorded tokens whose
    experts the trainer's router would have changed (what routing replay fixes)."""
    if not any(k.startswith("moe/") for r in rows for k in r):
        return []
    layers = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("moe/l") and k.count("/") == 2},
                    key=lambda x: int(x[1:]))
    return [("moe_load_cv", "Expert load: coefficient of variation of tokens per expert, per layer",
             tuple(f"moe/{x}/load_cv" for x in layers)),
            ("moe_load", "Expert load: busiest expert / mean, and share of cold experts (mean over layers)",
             ("moe/load_peak", "moe/cold")),
            ("moe_route_differ", "Routing: share of recorded tokens the trainer's router sends elsewhere, per layer",
             ("moe/route_differ", *(f"moe/{x}/route_differ" for x in layers)))]


HELDOUT_KEYS = ("heldout_success", "heldout_reward")
"""Curves of held-out evaluations: drawn per kind of evaluation (``_heldout_series``)."""


def eval_task_counts(run_dir: Path) -> dict[str, int]:
    """Tasks each held-out evaluation the run kept was scored on (``RUN/eval/<name>.jsonl``: one
    line per attempt), by name: ``baseline``, ``eval-<step>``, ``final``. Counted as the
    evaluation counts them (``rlonce.recipes.evaluate.heldout_success``): per source, its scored
    attempts over its arms (infrastructure failures are left out), summed over sources."""
    counts = {}
    for path in sorted((run_dir / "eval").glob("*.jsonl")) if (run_dir / "eval").is_dir() else []:
        rows = read_jsonl(path)
        arms: dict = {}
        scored: dict = {}
        for r in rows:
            arms.setdefault(r.get("source"), set()).add(r.get("arm"))
            scored[r.get("source")] = scored.get(r.get("source"), 0) + (not r.get("infra_failed"))
        counts[path.stem] = sum(n // len(arms[src]) for src, n in scored.items())
    return counts


def _eval_name(row: dict) -> tuple[str, str]:
    """A held-out point's kind ("baseline and final" or "mid-run") and its evaluation's file name."""
    if row.get("final"):
        return "baseline and final", "final"
    if row["step"] == 0 and "reward_mean" not in row:
        return "baseline and final", "baseline"
    return "mid-run", f"eval-{row['step']}"


def _heldout_series(rows: list[dict], key: str, counts: dict[str, int]) -> list[tuple[str, list, list]]:
    """``key``'s points as (label, steps, values) series: one per kind of evaluation and task count,
    the count in the label ("mid-run, n=4 tasks")."""
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        if r.get(key) is None:
            continue
        kind, name = _eval_name(r)
        n = counts.get(name)
        xs, ys = series.setdefault(f"{kind}, n={n} tasks" if n else kind, ([], []))
        xs.append(r["step"])
        ys.append(r[key])
    return [(label, xs, ys) for label, (xs, ys) in series.items()]


def _figure(rows: list[dict], key, baseline: float | None, counts: dict[str, int] | None = None):
    """The matplotlib figure of one curve (no title: the page captions it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5.2, 3.2), dpi=100)
    keys = key if isinstance(key, tuple) else (key,)
    if key in HELDOUT_KEYS:
        for label, xs, ys in _heldout_series(rows, key, counts or {}):
            ends = label.startswith("baseline")
            ax.plot(xs, ys, marker="s" if ends else "o", ms=6 if ends else 4, ls=":" if ends else "-",
                    color="black" if ends else "tab:blue", label=label)
    else:
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
            if pts:
                xs, ys = zip(*pts)
                target = k.endswith("/target_share")  # a source's target: dashed, beside its retained share
                ax.plot(xs, ys, marker=None if target or len(pts) >= 30 else "o", ms=3, ls="--" if target else "-",
                        label=k)
    if baseline is not None and key == "heldout_success":
        n = (counts or {}).get("baseline")
        ax.axhline(baseline, color="gray", ls="--", lw=1, label=f"baseline level{f' (n={n} tasks)' if n else ''}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0] and key in HELDOUT_KEYS:  # below the axes: it never hides a point
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    elif ax.get_legend_handles_labels()[0] and len(keys) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plot(rows: list[dict], key, title: str, baseline: float | None, counts: dict[str, int] | None = None) -> str:
    """One curve as a base64 PNG (``title`` is the caption the page gives it)."""
    import matplotlib.pyplot as plt

    fig = _figure(rows, key, baseline, counts)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def write_report(run_dir: Path) -> Path:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    baseline, counts = summary.get("baseline_success"), eval_task_counts(run_dir)
    figs = "".join(
        f'<figure><img src="data:image/png;base64,{_plot(rows, key, title, baseline, counts)}" alt="">'
        f"<figcaption>{html.escape(title)}</figcaption></figure>"
        for _, title, key in PLOTS + source_plots(rows) + grading_plots(rows) + moe_plots(rows)
    )
    table = summary_table(summary)
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    ledger_rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in LEDGER_COLUMNS) + "</tr>"
        for r in ledger
    )
    page = (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>rlonce run {html.escape(run_dir.name)}</title>\n"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
        "figure{display:inline-block;margin:0 1em 1em 0}\n"
        "table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px;vertical-align:top}"
        "td table{margin:0}</style>\n"
        f"</head><body><h1>rlonce run: {html.escape(run_dir.name)}</h1>\n"
        f"<h2>Summary</h2>{table}\n"
        f"<h2>Curves</h2>{figs}\n"
        "<h2>Ledger (sequences per step and source; groups_short and difficulty_skipped in groups)</h2><table>"
        f"<tr>{''.join(f'<th>{c}</th>' for c in LEDGER_COLUMNS)}</tr>{ledger_rows}</table>\n"
        "</body></html>"
    )
    out = run_dir / "report.html"
    out.write_text(page)
    return out


LEDGER_COLUMNS = ["step", "source", "dispatched", "finished", "infra_failed", "no_contrast_filtered",
                  "no_contrast_all_passed", "penalty_rejected", "unfinished_dropped", "stale_dropped", "retained",
                  "hack_zeroed", "length_penalized", "zero_advantage", "contexts_dropped", "unfinished_masked",
                  "policy_input_errors", "groups_short", "difficulty_skipped"]


def summary_table(summary: dict) -> str:
    """``summary.json`` as an HTML table; nested values are tables too (``_cell``)."""
    return "<table>" + "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>"
                               for k, v in summary.items()) + "</table>"


def _cell(v) -> str:
    """A summary value as HTML: a dict of dicts (per source) is a table with a row per key and a
    column per inner key, another dict a key/value table, a list of scalars comma-separated, a
    list of dicts a table with a row per item; everything else ``_fmt``, escaped."""
    if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
        cols = list(dict.fromkeys(k for x in v.values() for k in x))
        head = "<tr><th></th>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in cols) + "</tr>"
        body = "".join(f"<tr><th>{html.escape(str(k))}</th>" + "".join(f"<td>{_cell(x.get(c))}</td>" for c in cols)
                       + "</tr>" for k, x in v.items())
        return f"<table>{head}{body}</table>"
    if isinstance(v, dict) and v:
        return summary_table(v)
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return _cell({str(i): x for i, x in enumerate(v)})
    if isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v):
        return html.escape(", ".join(_fmt(x) for x in v)) if v else "none"
    return html.escape(_fmt(v))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "—"
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)
