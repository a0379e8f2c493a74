"""``report.html``: a self-contained page of plots (PNG embedded) and the run's summary table."""

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
    share, and training success, one line per source."""
    labels = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("src/") and k.endswith("/target_share")})
    if not labels:
        return []
    shares = tuple(f"src/{n}/{k}" for n in labels for k in ("retained_share", "target_share"))
    return [("source_share", "Retained share of the batch per source vs its target", shares),
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


def _plot(rows: list[dict], key, title: str, baseline: float | None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.2), dpi=100)
    keys = key if isinstance(key, tuple) else (key,)
    for k in keys:
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
        if pts:
            xs, ys = zip(*pts)
            target = k.endswith("/target_share")  # a source's target: dashed, beside its retained share
            ax.plot(xs, ys, marker=None if target or len(pts) >= 30 else "o", ms=3, ls="--" if target else "-",
                    label=k)
    if baseline is not None and key == "heldout_success":
        ax.axhline(baseline, color="gray", ls="--", lw=1, label="baseline (step 0)")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0] and (len(keys) > 1 or baseline is not None):
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def write_report(run_dir: Path) -> Path:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    baseline = summary.get("baseline_success")
    figs = "".join(
        f'<figure><img src="data:image/png;base64,{_plot(rows, key, title, baseline)}" alt="{html.escape(title)}">'
        f"<figcaption>{html.escape(title)}</figcaption></figure>"
        for _, title, key in PLOTS + source_plots(rows) + grading_plots(rows)
    )
    table = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
                    for k, v in summary.items())
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
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}</style>\n"
        f"</head><body><h1>rlonce run: {html.escape(run_dir.name)}</h1>\n"
        f"<h2>Summary</h2><table>{table}</table>\n"
        f"<h2>Curves</h2>{figs}\n"
        "<h2>Ledger (sequences per step and source; groups_short and difficulty_skipped in groups)</h2><table>"
        f"<tr>{''.join(f'<th>{c}</th>' for c in LEDGER_COLUMNS)}</tr>{ledger_rows}</table>\n"
        "</body></html>"
    )
    out = run_dir / "report.html"
    out.write_text(page)
    return out


LEDGER_COLUMNS = ["step", "source", "dispatched", "finished", "infra_failed", "no_contrast_filtered",
                  "penalty_rejected", "unfinished_dropped", "stale_dropped", "retained", "hack_zeroed",
                  "length_penalized", "zero_advantage", "contexts_dropped", "unfinished_masked", "policy_input_errors",
                  "groups_short",
                  "difficulty_skipped"]


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)
