"""Offline pre-training of the embedded base model (run once; its weights are shipped).

    python -m rlonce.recipes.pretrain [--steps 600]

The embedded model's domain (``DEFAULT_DOMAIN``, found through the registry) gives the documents
(``DomainSpec.base_corpus``: ``BaseCorpus.document``, written in the model's chat format): text
dense in the generic skills a tiny model lacks — looking a key up in its context, copying a span
into a tool call — where only the answers and calls carry loss. Batches of ``batch_rows``
documents, each row led by ``<|endoftext|>``, train the freshly initialised architecture (or,
with ``--resume``, the shipped weights) by SFT steps. Seeds are disjoint from every task split.
Why a tiny model needs this, and what the documents hold: ``rlonce.envs.toolfind.corpus``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

from rlonce.config import ConfigError
from rlonce.config.domains import DEFAULT_DOMAIN, load_domain
from rlonce.model.loader import EMBEDDED_DIR

OUT = EMBEDDED_DIR
"""Where the shipped embedded model lives (``rlonce.model.loader``); the recipe overwrites its file there."""


def base_corpus():
    """The embedded model's corpus: its domain's ``base_corpus`` (``rlonce.envs.domains.BaseCorpus``)."""
    spec = load_domain(DEFAULT_DOMAIN)
    if spec.base_corpus is None:
        raise ConfigError(f"the embedded model's domain {spec.name!r} gives no base corpus (DomainSpec.base_corpus)")
    return spec.base_corpus()


def text_of(doc: list[tuple[str, bool]]) -> str:
    return "".join(t for t, _ in doc)


def pretrain(steps: int, batch_rows: int = 32, lr: float = 3e-3, seed: int = 0, progress: bool = True,
             resume: bool = False):
    import torch
    from tqdm.auto import tqdm

    from rlonce.core.records import TrainingRow
    from rlonce.model.chat import get_format
    from rlonce.model.loader import init_embedded, load, materialize_embedded
    from rlonce.train.trainer import OptimSettings, Trainer

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="rlonce-pretrain-"))
    start = materialize_embedded(work / "init") if resume else init_embedded(work / "init", seed=seed)
    lm = load(start)
    corpus, fmt = base_corpus(), get_format(lm.chat_format)
    rng = random.Random(10_000 + seed + (7 if resume else 0))
    eot = lm.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    trainer = Trainer(lm.model, OptimSettings(lr=lr, warmup_steps=30, total_steps=steps, betas=(0.9, 0.95)),
                      micro_batch_tokens=1 << 20)
    bar = tqdm(range(steps), desc="pretrain", disable=not progress)
    for _ in bar:
        rows = []
        for _ in range(batch_rows):
            ids, mask = [eot], [0]
            for text, trained in corpus.document(rng, fmt):
                piece = lm.encode(text)
                ids += piece
                mask += [int(trained)] * len(piece)
            n = len(ids)
            rows.append(TrainingRow(ids, mask, [0.0] * n, [1.0] * n, [0] * n))
        m = trainer.sft_step(rows)
        bar.set_postfix(loss=f"{m['sft_loss']:.3f}", refresh=False)
    return lm, work


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--resume", action="store_true", help="continue from the shipped weights")
    args = ap.parse_args()
    lm, work = pretrain(args.steps, lr=args.lr, resume=args.resume)
    lm.model.to(dtype=__import__("torch").bfloat16).save_pretrained(work / "final")
    shutil.copy(work / "final" / "model.safetensors", OUT / "model.safetensors")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {OUT / 'model.safetensors'}")


if __name__ == "__main__":
    main()
