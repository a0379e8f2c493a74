"""Full fine-tuning against LoRA on one model, in what ``LocalBackend`` holds and does (docs/lora.md).

``--part memory`` (one arm per process: ``ru_maxrss`` is per process): load the model (with fresh
rank-``--rank`` adapters for ``lora``), the engine's plain copy (``lora.merged`` or a deep copy),
a ``Trainer``, two SFT steps on ``--rows`` random rows of ``--tokens`` tokens (three quarters
trained), one publish; prints the trainable parameters, step seconds, publish bytes and seconds,
peak RSS.

``--part publish`` (one process): the engine taking the whole state dict against merging an
adapter (``adapter_weights`` + ``merge_into``), interleaved, ``--repeats`` rounds.

    python benchmarks/lora/run.py --part memory --arm full --rows 1 --tokens 64
    python benchmarks/lora/run.py --part memory --arm lora --rows 1 --tokens 64
    python benchmarks/lora/run.py --part publish
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import time


def _load(model: str, rank: int):
    from rlonce.config import load_config
    from rlonce.model import loader

    settings = load_config(None, [f"model.lora.rank={rank}"]).model.lora
    return loader.load(loader.resolve(model, "runs/bench/lora-cache"), lora_settings=settings)


def memory(args) -> None:
    import torch

    from rlonce.core.records import TrainingRow
    from rlonce.model import lora
    from rlonce.train.checkpoint import tensor_bytes
    from rlonce.train.trainer import OptimSettings, Trainer

    lm = _load(args.model, args.rank if args.arm == "lora" else 0)
    engine_model = lora.merged(lm.peft) if lm.peft is not None else copy.deepcopy(lm.model)
    trainer = Trainer(lm.model, OptimSettings(lr=1e-4), adapter=lm.peft)
    gen = torch.Generator().manual_seed(1)
    T, prompt = args.tokens, args.tokens // 4
    vocab = lm.model.config.vocab_size
    rows = [TrainingRow(torch.randint(10, vocab, (T,), generator=gen).tolist(), [0] * prompt + [1] * (T - prompt),
                        [0.0] * T, [0.0] * T, [-1] * prompt + [0] * (T - prompt), group_id=f"g{i}")
            for i in range(args.rows)]
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
    trainable = sum(p.numel() for p in lm.model.parameters() if p.requires_grad)
    nbytes = state.nbytes if lm.peft is not None else tensor_bytes(state)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.arm}: trainable {trainable:,}; SFT step s {[round(x, 2) for x in steps]}; publish {nbytes:,} B in "
          f"{publish:.3f} s; peak RSS {peak:.0f} MB")


def publish(args) -> None:
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
    print(f"whole state dict: median {statistics.median(full):.3f} s {[round(x, 3) for x in full]}")
    print(f"adapter merged:   median {statistics.median(merge):.3f} s {[round(x, 3) for x in merge]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["memory", "publish"], required=True)
    p.add_argument("--arm", choices=["full", "lora"], default="lora")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    memory(args) if args.part == "memory" else publish(args)


if __name__ == "__main__":
    main()
