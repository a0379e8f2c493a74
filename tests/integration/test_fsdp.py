"""Data-parallel training (FSDP2, gloo): two processes, each holding half of a global batch,
make the update one process makes from the whole batch.

The two ranks are launched as torchrun would launch them — this file run as a script with
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set — and rank 0 writes the gathered weights and
the metrics of each case; the test compares them with a single-process ``Trainer``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlonce.config import AlgoConfig, objective_params
from rlonce.core.records import TrainingRow
from rlonce.train.distributed import rows_for_rank
from rlonce.train.minibatch import minibatch_splits
from rlonce.train.request import RLRequest
from rlonce.train.trainer import OptimSettings, Trainer, token_logprobs

WORLD = 2
MICRO = 30
"""Tokens per micro-batch: small, so the two ranks run different numbers of micro-batches."""
SETTINGS = OptimSettings(lr=1e-3, eps=1e-6, max_grad_norm=0.5)
"""Clipping is active (the gradient norm is ~5). ε = 1e-6, not 1e-8: the two runs sum gradients in
different orders, and Adam turns noise δ in a near-zero entry into a step of up to lr·δ/ε; at
ε = 1e-8 that reaches 3e-5 here."""


def _request(objective: str, agg: str, correction: str = "none", correction_cap: float = 2.0, minibatches: int = 1,
             **params) -> RLRequest:
    """rl_step's request: the config's objective parameters, overridden by ``params``; each step
    gives its seed and version."""
    return RLRequest(objective=objective, params=objective_params(AlgoConfig(objective=objective)) | params, agg=agg,
                     correction=correction, correction_cap=correction_cap, geometric_bounds=(0.999, 1.001),
                     kl_coef=0.0, topk_weight=0.0, routing_replay=True, qdq_align=False, minibatches=minibatches)


CASES = {
    "token-mean": {"steps": [{"seed": 0, "version": 0}, {"seed": 1, "version": 0}],
                   "request": _request("ppo", "token-mean", clip_low=0.2, clip_high=0.2, clip_c=None)},
    "prompt-mean+correction": {"steps": [{"seed": 0, "version": 0}],
                               "request": _request("ppo", "prompt-mean", "token", 1.2)},
    "masked IS, sequence": {"steps": [{"seed": 0, "version": 0}],  # masked rows leave every denominator
                            "request": _request("ppo", "prompt-mean", "sequence-mis", 1.2)},
    "seq-mean-token-mean, 2 mini-batches": {"steps": [{"seed": 3}],
                                            "request": _request("ppo", "seq-mean-token-mean", minibatches=2)},
    "seq-mean-token-sum-norm, cispo": {"steps": [{"seed": 0}],  # norm: the global padded length
                                       "request": _request("cispo", "seq-mean-token-sum-norm")},
    "one row, rank 1 has none": {"rows": 1, "steps": [{"seed": 0, "version": 0}],
                                 "request": _request("ppo", "token-mean", "token")},
    "sft": {"sft": True},
}
TOL = 1e-5


def global_batch(model) -> list[TrainingRow]:
    """Eight rows of varied lengths, some with an observation inside the trained span, advantages
    of both signs, one row at half weight, and rollout log-probs moved ±0.3 from the model's so
    that ratios leave the clip range. Rows ``2g`` and ``2g+1`` form group ``g``; odd rows carry
    top-k/top-p candidate sets of 3 to 7 tokens, which the trainer renormalises over."""
    rows = []
    for b, n in enumerate((9, 14, 6, 11, 17, 8, 12, 20)):
        ids = [(7 * b + 3 * t) % 700 + 10 for t in range(n)]
        mask = [0, 0] + [1] * (n - 2)
        if n > 10:
            mask[5:7] = [0, 0]
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([ids]), torch.ones(1, n, dtype=torch.long))[0][0].tolist()
        rollout = [0.0] + [min(x + 0.3 * ((t + b) % 3 - 1), 0.0) for t, x in enumerate(lp)]
        adv = (1.0, -0.5, 0.7, -1.2, 0.4, -0.9, 1.5, -0.3)[b]
        rows.append(TrainingRow(ids, mask, [x * m for x, m in zip(rollout, mask)], [adv * m for m in mask],
                                [0 if m else -1 for m in mask], weight=0.5 if b == 3 else 1.0, group_id=f"g{b // 2}",
                                candidates=[3 + t % 5 for t in range(n)] if b % 2 else None))
    return rows


def run_case(trainer: Trainer, rows: list[TrainingRow], case: dict) -> list[dict]:
    if case.get("sft"):
        return [trainer.sft_step(rows)]
    return [trainer.rl_step(rows, dataclasses.replace(case["request"], **step)) for step in case["steps"]]


def reference(model, rows: list[TrainingRow], case: dict) -> list[dict]:
    """One process on the whole batch. With several mini-batches, global mini-batch k is the
    k-th split of whole groups over every rank's rows (rank order; groups straddle ranks here),
    so it is trained as one rl_step each."""
    trainer = Trainer(model, SETTINGS, micro_batch_tokens=MICRO)
    k_splits = case["request"].minibatches if "request" in case else 1
    if k_splits == 1:
        return run_case(trainer, rows, case)
    assert case["request"].correction == "none" and len(case["steps"]) == 1
    seed = case["steps"][0]["seed"]
    flat = [r for rank in range(WORLD) for r in rows_for_rank(rows, rank, WORLD)]
    splits = minibatch_splits([r.group_id for r in flat], [len(r) for r in flat], k_splits, seed)
    assert len(splits) == k_splits
    request = dataclasses.replace(case["request"], minibatches=1)
    per_mb = [trainer.rl_step([flat[i] for i in sp], request) for sp in splits]
    out = {k: sum(m[k] for m in per_mb) / k_splits for k in per_mb[0]
           if k not in ("lr", "trained_tokens", "optimizer_steps")}
    return [out | {"optimizer_steps": float(sum(m["optimizer_steps"] for m in per_mb))}]  # a count, not a mean


def test_rows_for_rank_assigns_every_row_once_balanced_by_tokens():
    rows = [TrainingRow([1] * n, [0] * n, [0.0] * n, [0.0] * n, [-1] * n, group_id=str(i))
            for i, n in enumerate((30, 3, 17, 8, 8, 25, 2, 11, 9))]
    for world in (1, 2, 3, 4, 12):
        shards = [rows_for_rank(rows, r, world) for r in range(world)]
        ids = sorted(r.group_id for s in shards for r in s)
        assert ids == sorted(r.group_id for r in rows)  # every row exactly once
        assert all([rows.index(r) for r in s] == sorted(rows.index(r) for r in s) for s in shards)
        assert shards == [rows_for_rank(rows, r, world) for r in range(world)]  # deterministic
    two = [sum(len(r) for r in rows_for_rank(rows, k, 2)) for k in range(2)]
    # longest first, each to the lighter rank: 30 | 25+17 | +11 → 41 | +9 → 50 | +8 → 50 | tie, rank 0: 58
    # | +3 → 53 | +2 → 55
    assert two == [58, 55]
    with pytest.raises(ValueError):
        rows_for_rank(rows, 2, 2)


def test_two_ranks_make_the_single_process_update(lm, embedded_dir, tmp_path):
    rows = global_batch(lm.model)
    shards = [rows_for_rank(rows, r, WORLD) for r in range(WORLD)]
    chunks = [len(Trainer(lm.model, SETTINGS, micro_batch_tokens=MICRO)._micro_batches(s)) for s in shards]
    assert chunks[0] != chunks[1]  # one rank pads with passes that train nothing
    assert len({g.group_id for g in shards[0]} & {g.group_id for g in shards[1]}) > 0  # groups straddle ranks
    (tmp_path / "rows.pkl").write_bytes(pickle.dumps(rows))

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    procs = []
    try:
        for rank in range(WORLD):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen([sys.executable, __file__, str(embedded_dir), str(tmp_path)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out[-3000:]
    finally:
        for p in procs:
            p.kill()  # a rank left waiting on a collective after the other failed
    print(f"2 ranks: {time.monotonic() - t0:.1f} s")

    # one thread, as each rank: a job another test ran in this worker may have left two, and two threads
    # round differently (mismatch_corr, a correlation of near-equal log-probs, moved by 1.3e-4 that way)
    torch.set_num_threads(1)
    initial = {k: v.clone() for k, v in lm.model.state_dict().items()}
    for name, case in CASES.items():
        got = torch.load(tmp_path / f"{name}.pt")
        model = copy.deepcopy(lm.model)
        want = reference(model, rows[: case.get("rows")], case)
        ref = model.state_dict()
        assert set(got["state"]) == set(ref), name
        diff = max(float((got["state"][k] - ref[k]).abs().max()) for k in ref)
        moved = max(float((ref[k] - initial[k]).abs().max()) for k in ref)
        rel = max(abs(g[k] - v) / max(abs(v), 1e-7) for g, w in zip(got["metrics"], want) for k, v in w.items())
        print(f"{name}: max |param diff| {diff:.2e}, largest update {moved:.2e}, max metric rel diff {rel:.1e}")
        assert moved > 50 * TOL, name  # a real update (Adam moves a parameter by up to lr per step)
        assert diff < TOL, name
        assert torch.equal(got["state"]["lm_head.weight"], got["state"]["model.embed_tokens.weight"])
        assert len(got["metrics"]) == len(want), name
        for g, w in zip(got["metrics"], want):
            for k, v in w.items():  # grad_norm among them: Adam would hide a gradient off by a constant factor
                # 5e-5: token-mean's second-step loss (28.41, its ratios far outside the clip range) is
                # 28.41293 in one float32 process and 28.41186 in float64 — float32 alone is off by 4e-5
                assert g[k] == pytest.approx(v, rel=5e-5, abs=1e-6), (name, k)
    first = torch.load(tmp_path / "token-mean.pt")["metrics"][0]
    assert first["clipfrac"] > 0.1  # the ratios leave the clip range
    assert first["trained_tokens"] == sum(sum(r.loss_mask) for r in rows)
    assert first["mismatch_tokens"] == first["trained_tokens"]


def _rank_main(model_dir: str, out_dir: str) -> None:
    """One rank: shard the model, train on this rank's rows, and on rank 0 save what was gathered."""
    from rlonce.model.loader import load
    from rlonce.train.distributed import full_state_dict, init_process_group, shard_model

    torch.set_num_threads(1)
    rank, world = init_process_group()
    rows = pickle.loads((Path(out_dir) / "rows.pkl").read_bytes())
    for name, case in CASES.items():
        model = shard_model(load(model_dir).model)
        trainer = Trainer(model, SETTINGS, micro_batch_tokens=MICRO)
        metrics = run_case(trainer, rows_for_rank(rows[: case.get("rows")], rank, world), case)
        state = full_state_dict(model)
        if rank == 0:
            torch.save({"metrics": metrics, "state": state}, Path(out_dir) / f"{name}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2])
