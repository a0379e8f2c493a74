"""A trainer step repeats bit for bit across processes (``runtime.deterministic``), on rows that
share a prompt and the first tokens of their answers, at two torch threads.

Shared positions are read by several rows, so the packed forward's gathers repeat indices
(``rlonce.model.packing``) and their backward sums each position's gradients. Summed through
``index_put_(accumulate=True)`` (indexing with a tensor), the CPU kernel gives each of two
threads half of the reads and adds by atomic float adds in whatever order the threads reach a
position, and two runs of the same step part in the last bits. A position is racy only when
both halves read it; a group's rows sit side by side, so only a group that straddles the split
has such positions — hence one group of 16 rows here, where each thread adds into the shared
positions from its first row on. Each worker runs the step ``REPEATS`` times on fresh copies of
the model, and the two workers run at once with different ``PYTHONHASHSEED``s."""

import hashlib
import os
import subprocess
import sys
import time

GROUPS, GROUP_SIZE, PROMPT, SHARED, OWN = 1, 16, 48, 24, 40
"""Each group's rows: a PROMPT-token prompt, then SHARED trained tokens the group's rows have in
common, then OWN or more of the row's own."""
REPEATS = 3
THREADS = 2


def _rows(vocab: int):
    import torch

    from rlonce.core.records import TrainingRow

    g = torch.Generator().manual_seed(0)
    rows = []
    for k in range(GROUPS):
        prompt = torch.randint(3, vocab, (PROMPT,), generator=g).tolist()
        common = torch.randint(3, vocab, (SHARED,), generator=g).tolist()
        for j in range(GROUP_SIZE):
            answer = common + torch.randint(3, vocab, (OWN + 7 * j,), generator=g).tolist()
            ids = prompt + answer
            mask = [0] * len(prompt) + [1] * len(answer)
            old = [0.0] * len(prompt) + (-3.0 - torch.rand(len(answer), generator=g)).tolist()
            adv = [0.0] * len(prompt) + [1.0 if j % 2 else -1.0] * len(answer)
            rows.append(TrainingRow(ids, mask, old, adv, [-1] * len(prompt) + [0] * len(answer), group_id=f"g{k}"))
    return rows


def _worker(model_dir: str) -> None:
    """Print the parameters' digest before and after one trainer step, ``REPEATS`` times."""
    import copy

    import torch

    from rlonce.config import RunConfig
    from rlonce.model.loader import load
    from rlonce.train.builders import optim_settings, rl_request
    from rlonce.train.trainer import Trainer

    torch.set_num_threads(THREADS)
    cfg = RunConfig()
    base = load(model_dir).model
    rows = _rows(base.config.vocab_size)

    def digest(model) -> str:
        h = hashlib.sha256()
        for name, p in model.named_parameters():
            h.update(name.encode())
            h.update(p.detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    print("before", digest(base), flush=True)
    for _ in range(REPEATS):
        model = copy.deepcopy(base)
        trainer = Trainer(model, optim_settings(cfg.rl), micro_batch_tokens=cfg.runtime.micro_batch_tokens)
        trainer.rl_step(rows, rl_request(cfg, len(rows), step=1, version=0))
        print("after", digest(model), flush=True)


def test_a_trainer_step_on_rows_sharing_prefixes_repeats_bit_for_bit_across_processes(embedded_dir):
    import torch

    from rlonce.model.loader import load
    from rlonce.model.packing import Layout, micro_batches

    # the rows exercise what the race needed: several rows read one trained position
    model = load(embedded_dir).model
    rows = _rows(model.config.vocab_size)
    chunks = micro_batches(model, rows, 2048)
    assert len(chunks) == 1
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)], attn[b, : len(r)] = torch.tensor(r.token_ids), 1
    sel = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    for b, r in enumerate(rows):
        sel[b, : len(r) - 1] = torch.tensor(r.loss_mask[1:], dtype=torch.bool)
    at_N = Layout.of(attn, ids).where_BT()[:, :-1][sel]
    assert at_N.numel() - at_N.unique().numel() >= GROUPS * (GROUP_SIZE - 1) * (SHARED - 1)

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, __file__, str(embedded_dir)], env={**env, "PYTHONHASHSEED": seed},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in ("1", "2")]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
            outs.append([line.split() for line in out.splitlines()])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    befores = {d for out in outs for kind, d in out if kind == "before"}
    afters = [d for out in outs for kind, d in out if kind == "after"]
    assert len(befores) == 1 and len(afters) == 2 * REPEATS
    assert befores.isdisjoint(afters)  # the step changed the weights
    assert len(set(afters)) == 1, f"{len(set(afters))} different results in {time.monotonic() - t0:.0f} s"


if __name__ == "__main__":
    _worker(sys.argv[1])
