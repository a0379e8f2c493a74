"""Full fine-tuning against LoRA on one model, side by side: what ``LocalBackend`` holds and does.

docs/lora.md ("Measured") quotes its numbers.

    python benchmarks/lora/run.py --out DIR [--model smollm2|embedded|FOLDER] [--rank 16]
                                  [--shapes 1x64 8x256] [--kl-shape 4x64] [--kl-coef 0.1] [--rl-steps 2]
                                  [--repeats 7] [--threads 2]

Every measurement of memory runs in a process of its own (this script again, ``--child``), since
``ru_maxrss`` is the peak of the whole process; the full arm loads the model plain, the LoRA arm
with fresh rank-``--rank`` adapters (B = 0).

- memory, per arm and ``--shapes`` entry (ROWSxTOKENS): load, the engine's plain copy
  (``lora.merged`` or a deep copy, as ``LocalBackend`` makes it), a ``Trainer``, two SFT steps on
  random rows (three quarters of each row trained), one publish into the engine copy (the whole
  state dict, or the adapter's factors merged): trainable parameters, step seconds, publish bytes
  and seconds, peak RSS.
- the KL anchor, per arm: load, a ``Trainer`` (no engine copy), ``--rl-steps`` RL steps on
  ``--kl-shape`` random rows with ``algo.kl_coef`` = ``--kl-coef``, against the same with it 0.
  Full fine-tuning makes a frozen copy of the weights as the reference at its first KL step;
  LoRA scores the reference with the frozen base itself, the adapters disabled. Peak RSS of each,
  their difference, and the reference copy's tensor bytes read off the trainer.
- publish, one process: the engine taking the whole state dict against merging an adapter
  (``adapter_weights`` + ``merge_into``, B perturbed so the merge is not a no-op), interleaved,
  median of ``--repeats`` rounds.

Writes ``results.json``, ``results.md`` (full, LoRA and full / LoRA per quantity) and ``lora.png``.
Seconds depend on the machine's load; bytes and the reference's cost do not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("full", "lora")


def _load(model: str, rank: int):
    from rlonce.config import load_config
    from rlonce.model import loader

    settings = load_config(None, [f"model.lora.rank={rank}"]).model.lora
    return loader.load(loader.resolve(model, Path("runs/bench/lora-cache").resolve()), lora_settings=settings)


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rows(vocab: int, n: int, tokens: int, *, rl: bool):
    """``n`` rows of ``tokens`` random ids, the last three quarters trained; RL rows carry a rollout
    log-prob, a version and an advantage of alternating sign on their trained tokens."""
    import torch

    from rlonce.core.records import TrainingRow

    gen = torch.Generator().manual_seed(1)
    prompt = tokens // 4
    rows = []
    for i in range(n):
        ids = torch.randint(10, vocab, (tokens,), generator=gen).tolist()
        mask = [0] * prompt + [1] * (tokens - prompt)
        lp = [0.0] * prompt + [-2.0] * (tokens - prompt) if rl else [0.0] * tokens
        adv = [0.0] * prompt + [1.0 if i % 2 else -1.0] * (tokens - prompt) if rl else [0.0] * tokens
        rows.append(TrainingRow(ids, mask, lp, adv, [-1] * prompt + [0] * (tokens - prompt), group_id=f"g{i // 2}"))
    return rows


def child_memory(args) -> dict:
    import copy

    from rlonce.model import lora
    from rlonce.train.checkpoint import tensor_bytes
    from rlonce.train.trainer import OptimSettings, Trainer

    lm = _load(args.model, args.rank if args.arm == "lora" else 0)
    engine_model = lora.merged(lm.peft) if lm.peft is not None else copy.deepcopy(lm.model)
    trainer = Trainer(lm.model, OptimSettings(lr=1e-4), adapter=lm.peft)
    rows = _rows(lm.model.config.vocab_size, args.rows, args.tokens, rl=False)
    steps = []
    for _ in range(2):
        t = time.perf_counter()
        trainer.sft_step(rows)
        steps.append(time.perf_counter() - t)
    state = lora.adapter_weights(lm.peft) if lm.peft is not None else lm.model.state_dict()
    t = time.perf_counter()
    if lm.peft is not None:
        lora.merge_into(engine_model, state)
    else:
        engine_model.load_state_dict(state)
    publish = time.perf_counter() - t
    return {"trainable": sum(p.numel() for p in lm.model.parameters() if p.requires_grad),
            "step_seconds": steps, "publish_bytes": state.nbytes if lm.peft is not None else tensor_bytes(state),
            "publish_seconds": publish, "peak_mb": _peak_mb()}


def child_kl(args) -> dict:
    from rlonce.config import load_config
    from rlonce.train.builders import rl_request
    from rlonce.train.checkpoint import tensor_bytes
    from rlonce.train.trainer import OptimSettings, Trainer

    lm = _load(args.model, args.rank if args.arm == "lora" else 0)
    trainer = Trainer(lm.model, OptimSettings(lr=1e-4), adapter=lm.peft)
    rows = _rows(lm.model.config.vocab_size, args.rows, args.tokens, rl=True)
    cfg = load_config(None, [f"algo.kl_coef={args.kl_coef}"])
    before = _peak_mb()
    steps, kl = [], []
    for step in range(args.rl_steps):
        t = time.perf_counter()
        m = trainer.rl_step(rows, rl_request(cfg, len(rows), step, version=None))
        steps.append(time.perf_counter() - t)
        kl.append(m.get("kl"))
    ref = trainer.reference
    return {"kl_coef": args.kl_coef, "peak_mb_before_steps": before, "peak_mb": _peak_mb(), "step_seconds": steps,
            "kl": kl, "reference_bytes": 0 if ref is None else tensor_bytes(list(ref.state_dict().values()))}


def child_publish(args) -> dict:
    import torch

    from rlonce.model import lora

    lm = _load(args.model, args.rank)
    with torch.no_grad():
        for name, p in lm.peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    engine = lora.merged(lm.peft)
    whole = {k: v.clone() for k, v in engine.state_dict().items()}
    full, merge = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        engine.load_state_dict(whole)
        full.append(time.perf_counter() - t)
        t = time.perf_counter()
        lora.merge_into(engine, lora.adapter_weights(lm.peft))
        merge.append(time.perf_counter() - t)
    return {"full_seconds": full, "lora_seconds": merge}


CHILDREN = {"memory": child_memory, "kl": child_kl, "publish": child_publish}


def _spawn(args, part: str, **kw) -> dict:
    """This script in a fresh process, one measurement; its last stdout line is the result."""
    cmd = [sys.executable, __file__, "--child", part, "--model", args.model, "--rank", str(args.rank),
           "--threads", str(args.threads), "--repeats", str(args.repeats), "--rl-steps", str(args.rl_steps)]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _shape(s: str) -> tuple[int, int]:
    rows, tokens = s.lower().split("x")
    return int(rows), int(tokens)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def measure(args) -> dict:
    results: dict = {"model": args.model, "rank": args.rank, "threads": args.threads, "memory": [], "kl": []}
    for shape in args.shapes:
        rows, tokens = _shape(shape)
        for arm in ARMS:
            r = _spawn(args, "memory", arm=arm, rows=rows, tokens=tokens)
            results["memory"].append({"arm": arm, "shape": shape, **r})
            print(f"memory {shape} {arm}: trainable {r['trainable']:,}; SFT step s "
                  f"{[round(x, 2) for x in r['step_seconds']]}; publish {r['publish_bytes']:,} B in "
                  f"{r['publish_seconds']:.3f} s; peak RSS {r['peak_mb']:.0f} MB", flush=True)
    rows, tokens = _shape(args.kl_shape)
    for arm in ARMS:
        for coef in (0.0, args.kl_coef):
            r = _spawn(args, "kl", arm=arm, rows=rows, tokens=tokens, kl_coef=coef)
            results["kl"].append({"arm": arm, "shape": args.kl_shape, **r})
            print(f"RL {args.kl_shape} {arm} kl_coef {coef}: peak RSS {r['peak_mb']:.0f} MB "
                  f"({r['peak_mb_before_steps']:.0f} before the steps); reference {r['reference_bytes']:,} B; "
                  f"step s {[round(x, 2) for x in r['step_seconds']]}", flush=True)
    results["publish"] = p = _spawn(args, "publish")
    p["full_median"], p["lora_median"] = statistics.median(p["full_seconds"]), statistics.median(p["lora_seconds"])
    print(f"publish, {args.repeats} interleaved: whole state dict median {p['full_median']:.3f} s, "
          f"adapter merged median {p['lora_median']:.3f} s", flush=True)
    results["ratios"] = ratios(results)
    return results


def _kl_cost(results: dict, arm: str) -> dict:
    off, on = (next(r for r in results["kl"] if r["arm"] == arm and (r["kl_coef"] > 0) == k) for k in (False, True))
    return {"rss_mb": on["peak_mb"] - off["peak_mb"], "reference_bytes": on["reference_bytes"],
            "step_seconds_off": statistics.median(off["step_seconds"]),
            "step_seconds_on": statistics.median(on["step_seconds"])}


def ratios(results: dict) -> dict:
    """full / LoRA per quantity (None where LoRA's is 0). The reference's own cost has no ratio:
    LoRA's is none, and its RSS difference is noise."""
    mem = {(r["shape"], r["arm"]): r for r in results["memory"]}
    out = {}
    for shape in dict.fromkeys(r["shape"] for r in results["memory"]):
        f, lo = mem[shape, "full"], mem[shape, "lora"]
        out |= {"trainable": _ratio(f["trainable"], lo["trainable"]),
                "publish_bytes": _ratio(f["publish_bytes"], lo["publish_bytes"]),
                f"peak_mb {shape}": _ratio(f["peak_mb"], lo["peak_mb"]),
                f"sft_step_seconds {shape}": _ratio(statistics.median(f["step_seconds"]),
                                                    statistics.median(lo["step_seconds"]))}
    kl = {(r["arm"], r["kl_coef"] > 0): r for r in results["kl"]}
    for on, name in ((False, "off"), (True, "on")):
        out[f"peak_mb RL kl {name}"] = _ratio(kl["full", on]["peak_mb"], kl["lora", on]["peak_mb"])
    out["publish_seconds"] = _ratio(results["publish"]["full_median"], results["publish"]["lora_median"])
    return out


def _x(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


def table(results: dict, out: Path) -> str:
    from rlonce.telemetry.bench import write_table

    mem = {(r["shape"], r["arm"]): r for r in results["memory"]}
    shapes = list(dict.fromkeys(r["shape"] for r in results["memory"]))
    ra = results["ratios"]
    f0, l0 = mem[shapes[0], "full"], mem[shapes[0], "lora"]
    pct = 100 * l0["trainable"] / f0["trainable"]
    rows = [["trainable parameters", f"{f0['trainable']:,}", f"{l0['trainable']:,} ({pct:.1f} %)",
             _x(ra["trainable"])],
            ["publish bytes", f"{f0['publish_bytes']:,}", f"{l0['publish_bytes']:,}", _x(ra["publish_bytes"])]]
    for s in shapes:
        f, lo = mem[s, "full"], mem[s, "lora"]
        rows.append([f"peak RSS, SFT {s} (rows x tokens), MB", f"{f['peak_mb']:.0f}", f"{lo['peak_mb']:.0f}",
                     _x(ra[f"peak_mb {s}"])])
    for s in shapes:
        f, lo = mem[s, "full"], mem[s, "lora"]
        rows.append([f"SFT step seconds (two steps), {s}", ", ".join(f"{x:.2f}" for x in f["step_seconds"]),
                     ", ".join(f"{x:.2f}" for x in lo["step_seconds"]), _x(ra[f"sft_step_seconds {s}"])])
    kl = {(r["arm"], r["kl_coef"] > 0): r for r in results["kl"]}
    coef = next(r["kl_coef"] for r in results["kl"] if r["kl_coef"] > 0)
    shape = results["kl"][0]["shape"]
    for on, name in ((False, "off"), (True, "on")):
        rows.append([f"peak RSS, {len(kl['full', on]['step_seconds'])} RL steps {shape}, kl_coef "
                     f"{coef if on else 0}, MB (no engine copy)",
                     f"{kl['full', on]['peak_mb']:.0f}", f"{kl['lora', on]['peak_mb']:.0f}",
                     _x(ra[f"peak_mb RL kl {name}"])])
    cost = {a: _kl_cost(results, a) for a in ARMS}
    rows += [["KL reference: peak RSS on − off, MB", f"{cost['full']['rss_mb']:+.0f}", f"{cost['lora']['rss_mb']:+.0f}",
              ""],
             ["KL reference: tensor bytes of the trainer's copy", f"{cost['full']['reference_bytes']:,}",
              f"{cost['lora']['reference_bytes']:,} (the base, adapters disabled)", ""],
             ["RL step seconds (median), kl off / on",
              f"{cost['full']['step_seconds_off']:.2f} / {cost['full']['step_seconds_on']:.2f}",
              f"{cost['lora']['step_seconds_off']:.2f} / {cost['lora']['step_seconds_on']:.2f}", ""]]
    p = results["publish"]
    rows.append([f"publish into the in-process engine, median of {len(p['full_seconds'])} interleaved, s",
                 f"{p['full_median']:.4f} (state dict copied)", f"{p['lora_median']:.4f} (W0 + s·B·A per weight)",
                 _x(ra["publish_seconds"])])
    head = ["", "full", f"LoRA r={results['rank']}", "full / LoRA"]
    return write_table(out / "results.md", head, rows)


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"full": "tab:blue", "lora": "tab:orange"}
    names = {"full": "full", "lora": f"LoRA r={results['rank']}"}
    kl = {(r["arm"], r["kl_coef"] > 0): r for r in results["kl"]}
    cases = [f"SFT\n{r['shape']}" for r in results["memory"] if r["arm"] == "full"]
    cases += [f"RL {results['kl'][0]['shape']}\nKL off", f"RL {results['kl'][0]['shape']}\nKL on"]
    rss = {a: [r["peak_mb"] for r in results["memory"] if r["arm"] == a] + [kl[a, False]["peak_mb"],
                                                                             kl[a, True]["peak_mb"]] for a in ARMS}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), gridspec_kw={"width_ratios": [2.4, 1, 1]})
    ax = axes[0]
    for k, a in enumerate(ARMS):
        xs = [x + (k - 0.5) * 0.4 for x in range(len(cases))]
        bars = ax.bar(xs, rss[a], 0.4, color=colors[a], label=names[a])
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(list(range(len(cases))), cases, fontsize=8)
    ax.set_xlabel("batch (rows x tokens)")
    ax.set_ylabel("peak RSS of the process (MB)")
    ax.set_title(f"{results['model']}: memory (one process per bar)", fontsize=10)
    ax.legend(fontsize=8)
    f0 = next(r for r in results["memory"] if r["arm"] == "full")
    l0 = next(r for r in results["memory"] if r["arm"] == "lora")
    bars = axes[1].bar([names[a] for a in ARMS], [f0["publish_bytes"] / 1e6, l0["publish_bytes"] / 1e6],
                       color=[colors[a] for a in ARMS])
    axes[1].bar_label(bars, fmt="%.2f", fontsize=8)
    axes[1].set_ylabel("bytes per publish (MB)")
    axes[1].set_title(f"publish bytes ({_x(results['ratios']['publish_bytes'])} fewer)", fontsize=10)
    p = results["publish"]
    bars = axes[2].bar([f"{names['full']}\n(state dict)", f"{names['lora']}\n(merge)"],
                       [1e3 * p["full_median"], 1e3 * p["lora_median"]], color=[colors[a] for a in ARMS])
    axes[2].bar_label(bars, fmt="%.1f", fontsize=8)
    axes[2].set_ylabel("ms per publish (median)")
    axes[2].set_title("publish into the engine copy", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "lora.png", dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--model", default="smollm2", help="smollm2, embedded or a model folder")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--shapes", nargs="+", default=["1x64", "8x256"], help="SFT batches, ROWSxTOKENS")
    ap.add_argument("--kl-shape", default="4x64", help="the RL steps' batch, ROWSxTOKENS")
    ap.add_argument("--kl-coef", type=float, default=0.1)
    ap.add_argument("--rl-steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is None and args.out is None:
        ap.error("--out is required")
    if args.child is not None:
        import torch

        torch.manual_seed(0)
        torch.set_num_threads(args.threads)
        print(json.dumps(CHILDREN[args.child](args)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = measure(args)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results, out))
    plot(results, out)
    print("full / LoRA: " + ", ".join(f"{k} {_x(v)}" for k, v in results["ratios"].items()))


if __name__ == "__main__":
    main()
