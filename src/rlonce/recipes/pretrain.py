"""Offline pre-training of the embedded base models (run once; their weights are shipped).

    python -m rlonce.recipes.pretrain [--model embedded|embedded-moe] [--steps N]

The embedded model's domain (``DEFAULT_DOMAIN``, found through the registry) gives the documents
(``DomainSpec.base_corpus``: ``BaseCorpus.document``, written in the model's chat format): text
dense in the generic skills a tiny model lacks — looking a key up in its context, copying a span
into a tool call — where only the answers and calls carry loss. Batches of ``batch_rows``
documents, each row led by ``<|endoftext|>``, train the freshly initialised architecture (or,
with ``--resume``, the shipped weights) by SFT steps. Seeds are disjoint from every task split.
Why a tiny model needs this, and what the documents hold: ``rlonce.envs.toolfind.corpus``.

``embedded-moe``, the sparse sibling (``rlonce.model.loader.EMBEDDED_MOE_ARCH``), trains on the
same corpus with Switch Transformer's load-balancing loss added (Fedus et al. 2021, eq. 4–6, per
layer, ``AUX_COEF`` times its mean over layers): without it a router is free to send most tokens
to a few experts. Measured here (docs/models.md), 600 steps without the term left one expert a
sixth of an even share and a held-out loss of 0.54; 2,000 steps with it reach 0.026 (the dense
model: 0.13) with every expert between 0.10 and 0.16 of its layer's routings. The trainer's
``sft_step`` runs the forward and backward itself and optimises only the cross-entropy, so each
layer's term enters through its router (``BalanceLoss``): the router's output carries the term
into the same backward, and the trainer's one optimizer step applies both gradients. At the end
the recipe prints each layer's expert load on held-out documents.
"""

from __future__ import annotations

import argparse
import functools
import random
import shutil
import tempfile
from pathlib import Path

from rlonce.config import ConfigError
from rlonce.config.domains import DEFAULT_DOMAIN, load_domain
from rlonce.model.loader import EMBEDDED_DIR, EMBEDDED_WEIGHTS

OUT = EMBEDDED_DIR
"""Where the shipped embedded models live (``rlonce.model.loader``); the recipe overwrites a file there."""

MODELS = {"embedded": False, "embedded-moe": True}
"""The models this recipe pre-trains, and whether each is the mixture of experts."""

DEFAULT_STEPS = {"embedded": 1000, "embedded-moe": 2000}
"""Steps each shipped model was pre-trained for (docs/quickstart.md, docs/models.md)."""
"""Steps of ``batch_rows`` documents: the sparse model's routers and experts need more of them to
pass the dense model's held-out loss (1,200 steps: 0.164; 2,000: 0.026; 19 min on 2 cores)."""

AUX_COEF = 0.01
"""The load-balancing loss's weight (Switch Transformer's α); 0 leaves a router unbalanced."""

EVAL_SEED = 20_000
"""Seed of the held-out documents the final loss and the expert load are measured on: disjoint
from the training seeds (10,000 + ``seed``, + 7 when resumed) and from every task split."""


def base_corpus():
    """The embedded model's corpus: its domain's ``base_corpus`` (``rlonce.envs.domains.BaseCorpus``)."""
    spec = load_domain(DEFAULT_DOMAIN)
    if spec.base_corpus is None:
        raise ConfigError(f"the embedded model's domain {spec.name!r} gives no base corpus (DomainSpec.base_corpus)")
    return spec.base_corpus()


def text_of(doc: list[tuple[str, bool]]) -> str:
    return "".join(t for t, _ in doc)


def documents(lm, corpus, fmt, rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
    """``n`` corpus documents as (token ids, loss mask), each led by ``<|endoftext|>`` (untrained)."""
    eot = lm.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    out = []
    for _ in range(n):
        ids, mask = [eot], [0]
        for text, trained in corpus.document(rng, fmt):
            piece = lm.encode(text)
            ids += piece
            mask += [int(trained)] * len(piece)
        out.append((ids, mask))
    return out


class BalanceLoss:
    """Adds ``coef`` × a layer's load-balancing loss to the gradient of the backward that its
    router's forward feeds, as a forward hook on the router (``Qwen3MoeTopKRouter``).

    The router returns (logits, routing weights, expert indices); the MoE block drops the logits
    and scales each expert's output by its routing weight, so the weights are on the path of the
    trainer's loss. The hook passes them through ``_with_loss``, which is the identity forward and
    in backward also gives the loss term a gradient of 1 — the term is then differentiated through
    the router's logits within the same backward (DeepSeek-V2's ``AddAuxiliaryLoss``). Only
    training forwards under autograd add it; the term of the last one is kept in ``last`` (a
    metric). One forward per optimizer step: the recipe's micro-batch budget holds a whole step."""

    def __init__(self, coef: float, num_experts: int, top_k: int):
        self.coef, self.num_experts, self.top_k = coef, num_experts, top_k
        self.last = 0.0

    def __call__(self, module, args, output):
        import torch
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        if not (module.training and torch.is_grad_enabled()):
            return output
        logits_NE, weights_NK, experts_NK = output
        aux = load_balancing_loss_func((logits_NE,), self.num_experts, self.top_k)
        self.last = float(aux.detach())
        return logits_NE, _with_loss(weights_NK, self.coef * aux), experts_NK


@functools.cache
def _loss_carrier():
    """The autograd function behind ``_with_loss`` (built on first use: torch loads lazily here)."""
    import torch

    class WithLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, loss):
            ctx.loss_shape, ctx.loss_dtype = loss.shape, loss.dtype
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad, torch.ones(ctx.loss_shape, dtype=ctx.loss_dtype, device=grad.device)

    return WithLoss


def _with_loss(x, loss):
    """``x`` unchanged; a backward through it also differentiates ``loss`` (d total / d loss = 1)."""
    return _loss_carrier().apply(x, loss)


def expert_load(model, docs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """Per layer, the share of its routings (token × top-k choices) that went to each expert over
    ``docs``, each run alone (no padding): the router's chosen indices, taken by a forward hook."""
    import torch

    from rlonce.model.moe import routers

    rs = routers(model)
    counts = [torch.zeros(r.num_experts) for r in rs]

    def count(layer):
        def hook(module, args, output):
            counts[layer] += torch.bincount(output[2].reshape(-1), minlength=module.num_experts).float()
        return hook

    handles = [r.register_forward_hook(count(i)) for i, r in enumerate(rs)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for ids, _ in docs:
                model(input_ids=torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return [(c / c.sum()).tolist() for c in counts]


def heldout_loss(model, docs: list[tuple[list[int], list[int]]]) -> float:
    """Token-mean cross-entropy on the trained tokens of ``docs`` (what the SFT steps minimise)."""
    import torch
    import torch.nn.functional as F

    total, n = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for ids, mask in docs:
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            m = torch.tensor(mask[1:], dtype=torch.bool)
            total += float(F.cross_entropy(logits[m], torch.tensor(ids[1:])[m], reduction="sum"))
            n += int(m.sum())
    model.train(was_training)
    return total / n


def pretrain(steps: int, batch_rows: int = 32, lr: float = 3e-3, seed: int = 0, progress: bool = True,
             resume: bool = False, moe: bool = False, aux_coef: float = AUX_COEF):
    """Pre-train the embedded model (``moe``: ``embedded-moe``, with ``aux_coef`` × the
    load-balancing loss); the loaded model and the scratch folder (the caller removes it)."""
    import torch
    from tqdm.auto import tqdm

    from rlonce.core.records import TrainingRow
    from rlonce.model.chat import get_format
    from rlonce.model.loader import init_embedded, load, materialize_embedded
    from rlonce.model.moe import routers
    from rlonce.train.trainer import OptimSettings, Trainer

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="rlonce-pretrain-"))
    start = materialize_embedded(work / "init", moe=moe) if resume else init_embedded(work / "init", seed=seed, moe=moe)
    lm = load(start)
    corpus, fmt = base_corpus(), get_format(lm.chat_format)
    rng = random.Random(10_000 + seed + (7 if resume else 0))
    trainer = Trainer(lm.model, OptimSettings(lr=lr, warmup_steps=30, total_steps=steps, betas=(0.9, 0.95)),
                      micro_batch_tokens=1 << 20)
    balance = None
    if moe and aux_coef > 0:
        cfg = lm.model.config
        balance = BalanceLoss(aux_coef / cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok)
        hooks = [r.register_forward_hook(balance) for r in routers(lm.model)]
    bar = tqdm(range(steps), desc="pretrain", disable=not progress)
    for _ in bar:
        rows = [TrainingRow(ids, mask, [0.0] * len(ids), [1.0] * len(ids), [0] * len(ids))
                for ids, mask in documents(lm, corpus, fmt, rng, batch_rows)]
        m = trainer.sft_step(rows)
        post = {"loss": f"{m['sft_loss']:.3f}"}
        if balance is not None:
            post["aux"] = f"{balance.last:.3f}"
        bar.set_postfix(post, refresh=False)
    if balance is not None:
        for h in hooks:
            h.remove()
    return lm, work


def main() -> None:
    import time

    import torch

    from rlonce.model.chat import get_format

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="embedded")
    ap.add_argument("--steps", type=int, default=None, help=f"default {DEFAULT_STEPS}")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux-coef", type=float, default=AUX_COEF,
                    help=f"embedded-moe: the load-balancing loss's weight (default {AUX_COEF})")
    ap.add_argument("--resume", action="store_true", help="continue from the shipped weights")
    args = ap.parse_args()
    moe = MODELS[args.model]
    steps = args.steps if args.steps is not None else DEFAULT_STEPS[args.model]
    t0 = time.monotonic()
    lm, work = pretrain(steps, lr=args.lr, resume=args.resume, moe=moe, aux_coef=args.aux_coef)
    minutes = (time.monotonic() - t0) / 60
    held = documents(lm, base_corpus(), get_format(lm.chat_format), random.Random(EVAL_SEED), 64)
    print(f"{args.model}: {steps} steps in {minutes:.1f} min; held-out loss {heldout_loss(lm.model, held):.4f} "
          f"on {len(held)} documents")
    if moe:
        for i, shares in enumerate(expert_load(lm.model, held)):
            print(f"layer {i} expert load: {' '.join(f'{s:.3f}' for s in shares)} "
                  f"(min {min(shares):.3f}, max {max(shares):.3f})")
    lm.model.to(dtype=torch.bfloat16).save_pretrained(work / "final")
    out = OUT / EMBEDDED_WEIGHTS[moe]
    shutil.copyfile(work / "final" / "model.safetensors", out)  # a new file gets the usual mode, not the scratch one
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
