"""Top-k/top-p candidate sets on the embedded model: how big they are, what recording them costs,
and the ratio π_train/μ at identical weights with and without renormalising over them.

    python benchmarks/candidates/run.py [--out DIR] [--tasks 32] [--max-tokens 64]

Sizes and bytes: the torch engine samples turns for ``--tasks`` toolfind prompts at top_p 0.9 and
0.99 (temperature 1). What rlonce records per token is the set's size (one integer); for
comparison the table also prices the explicit token ids of each set. Bytes are per sampled token:
``packed`` is a fixed-width array (uint16 while the vocabulary is under 65,536), ``pickle`` what a
Ray payload or ``trainer_state.pt`` holds for the Python list, ``json`` the gateway's export.

Ratios: 4 prompts × 24 tokens for each top_p ∈ {0.5, 0.7, 0.9, 1.0} × top_k ∈ {0, 5, 50}, the
trainer's log-probs (masked-head path) against the engine's, in float32 (as shipped) and in
float64 (which leaves only the renormalisation). Writes ``candidates.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import pickle
import statistics
import tempfile
from pathlib import Path


def _generate(engine, prompts, params):
    async def go():
        return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))
    return asyncio.run(go())


def _engine(lm, model):
    from rlonce.engine.torch_engine import TorchEngine

    return TorchEngine(copy.deepcopy(model), eos_token_ids=lm.eos_token_ids, pad_token_id=0, max_batch_size=64)


def sizes_and_bytes(lm, tasks: int, max_tokens: int) -> dict:
    from rlonce.engine.base import SamplingParams
    from rlonce.envs.toolfind.env import SYSTEM_PROMPT
    from rlonce.envs.toolfind.tasks import make_task
    from rlonce.envs.workspace import BASH_TOOL, SUBMIT_TOOL
    from rlonce.gateway.messages import Message
    from rlonce.model.chat import get_format

    fmt = get_format(lm.chat_format)
    prompts = [lm.encode(fmt.render([Message("system", SYSTEM_PROMPT), Message("user", make_task("train", i).question)],
                                    [BASH_TOOL, SUBMIT_TOOL])) for i in range(tasks)]
    engine, out = _engine(lm, lm.model), {}
    try:
        for top_p in (0.9, 0.99):
            gens = _generate(engine, prompts, [SamplingParams(max_tokens=max_tokens, top_p=top_p, seed=i)
                                               for i in range(tasks)])
            sizes = [k for g in gens for k in g.candidates]
            ids = [list(range(k)) for k in sizes]  # the explicit alternative: k ids (values do not change the size)
            n = len(sizes)
            out[f"top_p={top_p}"] = {
                "tokens": n, "size_mean": statistics.fmean(sizes), "size_median": statistics.median(sizes),
                "size_p95": sorted(sizes)[int(0.95 * (n - 1))], "size_max": max(sizes),
                "size_one_share": sizes.count(1) / n,
                "count_bytes": {"packed": 2.0, "pickle": len(pickle.dumps(sizes)) / n,
                                "json": len(json.dumps(sizes)) / n},
                "ids_bytes": {"packed": 2.0 * statistics.fmean(sizes) + 2.0,  # uint16 ids + a uint16 length
                              "pickle": len(pickle.dumps(ids)) / n, "json": len(json.dumps(ids)) / n}}
    finally:
        engine.close()
    return out


def ratios(lm, dtype: str) -> dict:
    import torch

    from rlonce.core.records import Context, Role, Segment, Sequence, sequence_to_rows
    from rlonce.engine.base import SamplingParams
    from rlonce.train.trainer import pad_rows, token_logprobs

    model = copy.deepcopy(lm.model).to(getattr(torch, dtype))
    grid = list(itertools.product([0.5, 0.7, 0.9, 1.0], [0, 5, 50]))
    prompts = [[1, 50, 60, 70], [1, 80], [1, 90, 91, 92, 93, 94, 95], [1, 100, 101]]
    engine = _engine(lm, model)
    try:
        gens = _generate(engine, prompts * len(grid), [SamplingParams(max_tokens=24, top_p=tp, top_k=tk, seed=i)
                                                       for i, (tp, tk) in enumerate(grid) for _ in prompts])
    finally:
        engine.close()
    out = {}
    for k, (top_p, top_k) in enumerate(grid):
        rows = []
        for p, g in zip(prompts, gens[k * len(prompts):(k + 1) * len(prompts)]):
            seg = Segment(Role.MODEL, g.token_ids, g.logprobs, g.versions, candidates=g.candidates)
            rows += sequence_to_rows(Sequence("t", "a", [Context([Segment(Role.PROMPT, p), seg])]), 1.0)
        b = pad_rows(rows)
        sel = b.mask_BT > 0
        row = {}
        for name, cand in (("renormalised", b.cand_BT), ("full_vocabulary", None)):
            with torch.no_grad():
                lp, _ = token_logprobs(model, b.ids_BT, b.attn_BT, mask_BT=b.mask_BT, cand_BT=cand)
            r = (lp[sel] - b.old_lp_BT[sel]).double().exp()
            row[name] = {"mean": float(r.mean()), "min": float(r.min()), "max": float(r.max())}
        out[f"top_p={top_p},top_k={top_k}"] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from rlonce.model.loader import load, materialize_embedded

    lm = load(materialize_embedded(Path(tempfile.mkdtemp()) / "embedded"))
    result = {"sizes_and_bytes": sizes_and_bytes(lm, a.tasks, a.max_tokens),
              "ratios_float32": ratios(lm, "float32"), "ratios_float64": ratios(lm, "float64")}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "candidates.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
