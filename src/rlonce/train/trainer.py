"""The trainer: recomputes log-probs, applies an objective, steps AdamW, saves what resume needs.

It consumes ``TrainingRow``s only — token ids, loss mask, rollout log-probs, advantages —
never raw rewards. Losses come from ``rlonce.algo`` by name; the trainer never branches on
their names. Each mini-batch is split into micro-batches of at most ``micro_batch_tokens``
tokens (``rlonce.model.packing.micro_batches``); aggregation weights are computed over the
whole mini-batch first (and scaled by each row's ``weight``), so the accumulated gradient
equals the full-batch one. Each row's log-probs are taken at the temperature it was sampled at
(``TrainingRow.temperature``): rows of different sources can share a micro-batch.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlonce.algo.losses import aggregation_weights, kl_k3, policy_loss, topk_kl
from rlonce.core.records import TrainingRow
from rlonce.model import moe, mxfp4
from rlonce.model.logits import selected_logits, token_logprobs_over
from rlonce.model.packing import micro_batches
from rlonce.model.precision import autocast
from rlonce.train.distributed import cat_over_ranks, data_parallel_group, gather, sum_over_ranks
from rlonce.train.minibatch import rank_splits
from rlonce.train.request import RLRequest
from rlonce.train.row_terms import correct_rows, correction_metrics, frozen_copy, pad_like, same_version


@dataclass(kw_only=True)
class OptimSettings:
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    total_steps: int = 0
    """With total_steps > 0 the rate follows a cosine to 10% after warm-up; else it stays flat."""
    freeze_router: bool = False
    """A sparse model's routers stay out of the optimizer (``model.freeze_router``): their weights
    never change, so every published state carries them as they were."""


@dataclass
class Batch:
    ids_BT: torch.Tensor
    attn_BT: torch.Tensor
    mask_BT: torch.Tensor
    old_lp_BT: torch.Tensor
    adv_BT: torch.Tensor
    weight_B: torch.Tensor
    temp_B: torch.Tensor
    """Each row's sampling temperature (float32, as the engine divides by it)."""
    group_ids: list[str]
    cand_BT: torch.Tensor | None = None
    """Candidate-set size of each next token (0: the whole vocabulary); None when no row has one."""
    topk_ids_BTK: torch.Tensor | None = None
    """The teacher's k most likely next tokens at each position (``TrainingRow.teacher_topk``; 0 where
    a row has none); None when no row has them."""
    topk_lp_BTK: torch.Tensor | None = None
    """Their teacher log-probs (0 where a row has none)."""
    topk_BT: torch.Tensor | None = None
    """1 where a position has the teacher's top-k."""
    routes_BTLK: torch.Tensor | None = None
    """A sparse policy's recorded experts at each input position (``TrainingRow.routes``; B×T×layers×k
    aligned with ``ids_BT``, -1 where a row has none); None when no row has them."""


def pad_rows(rows: list[TrainingRow]) -> Batch:
    """Right-pad rows; per-token fields are shifted so position t describes token t+1."""
    T = max(len(r) for r in rows) - 1
    B = len(rows)
    ids = torch.zeros((B, T + 1), dtype=torch.long)
    attn = torch.zeros((B, T + 1), dtype=torch.long)
    mask = torch.zeros((B, T))
    old, adv = torch.zeros((B, T)), torch.zeros((B, T))
    cand = torch.zeros((B, T), dtype=torch.long) if any(r.candidates for r in rows) else None
    K = max((len(t) for r in rows if r.teacher_topk for t in r.teacher_topk), default=0)
    top_ids, top_lp, has_top = (torch.zeros((B, T, K), dtype=torch.long), torch.zeros((B, T, K)),
                                torch.zeros((B, T))) if K else (None, None, None)
    for b, r in enumerate(rows):
        n = len(r)
        ids[b, :n] = torch.tensor(r.token_ids)
        attn[b, :n] = 1
        mask[b, : n - 1] = torch.tensor(r.loss_mask[1:], dtype=torch.float32)
        old[b, : n - 1] = torch.tensor(r.rollout_logprobs[1:])
        adv[b, : n - 1] = torch.tensor(r.advantages[1:])
        if cand is not None and r.candidates:
            cand[b, : n - 1] = torch.tensor(r.candidates[1:])
        if K and r.teacher_topk:
            for t, pairs in enumerate(r.teacher_topk[1:]):
                if pairs:
                    top_ids[b, t] = torch.tensor([tok for tok, _ in pairs])
                    top_lp[b, t] = torch.tensor([lp for _, lp in pairs])
                    has_top[b, t] = 1.0
    weight = torch.tensor([r.weight for r in rows], dtype=torch.float32)
    temp = torch.tensor([r.temperature for r in rows], dtype=torch.float32)
    routes = None
    shapes = {r.routes.shape[1:] for r in rows if r.routes is not None}
    if len(shapes) > 1:
        raise ValueError(f"rows of one batch carry routes of different shapes {sorted(shapes)}")
    if shapes:
        routes = torch.full((B, T + 1, *shapes.pop()), -1, dtype=torch.long)
        for b, r in enumerate(rows):
            if r.routes is not None:
                routes[b, : len(r.routes)] = torch.from_numpy(r.routes.astype("int64"))
    return Batch(ids, attn, mask, old, adv, weight, temp, [r.group_id for r in rows], cand_BT=cand,
                 topk_ids_BTK=top_ids, topk_lp_BTK=top_lp, topk_BT=has_top, routes_BTLK=routes)


@dataclass
class TokenScores:
    """What one forward of ``score_tokens`` gives, each B×T-1 (×K) on the CPU, 0 where not computed."""

    lp_BT: torch.Tensor
    ent_BT: torch.Tensor | None = None
    at_BTK: torch.Tensor | None = None
    """The log-prob of each token ``at_BTK`` names, over the whole vocabulary (differentiable)."""
    top_ids_BTK: torch.Tensor | None = None
    """The k most likely tokens at each position (without gradient), with ``top_lp_BTK``."""
    top_lp_BTK: torch.Tensor | None = None


def token_logprobs(model, ids_BT: torch.Tensor, attn_BT: torch.Tensor, temperature: float | torch.Tensor = 1.0,
                   with_entropy: bool = False, mask_BT: torch.Tensor | None = None,
                   cand_BT: torch.Tensor | None = None):
    """``score_tokens``' log-probs and entropy: (lp_BT, ent_BT or None)."""
    s = score_tokens(model, ids_BT, attn_BT, temperature, with_entropy=with_entropy, mask_BT=mask_BT, cand_BT=cand_BT)
    return s.lp_BT, s.ent_BT


def score_tokens(model, ids_BT: torch.Tensor, attn_BT: torch.Tensor, temperature: float | torch.Tensor = 1.0, *,
                 with_entropy: bool = False, mask_BT: torch.Tensor | None = None, cand_BT: torch.Tensor | None = None,
                 at_BTK: torch.Tensor | None = None, topk: int = 0) -> TokenScores:
    """Log-prob of each next token (length T-1) under ``model`` at ``temperature``, and entropy.

    ``temperature`` is one for all rows or one per row (B, ``Batch.temp_B``): each row's logits
    are divided by its own, as the engine divided them when it sampled the row.

    With ``cand_BT`` (B×T-1, ``Batch.cand_BT``) each log-prob and entropy is taken over the
    token's recorded candidate set — the k highest logits where k > 0 — instead of the whole
    vocabulary (``rlonce.model.logits.token_logprobs_over``), so that at the rollout's weights
    it equals the log-prob the engine sampled with under top-k/top-p.

    With ``mask_BT`` (B×T-1) the LM head, softmax and entropy are computed only where it is 1 —
    the trained tokens — and the other positions are 0: prompts and observations cost the
    decoder but not the vocabulary-wide head (a quarter of a 135M model's FLOPs, and most of its
    memory traffic).

    With ``at_BTK`` (B×T-1×K token ids) the same forward also gives each named token's log-prob
    over the whole vocabulary at the row's temperature (the top-k distillation term's student
    side), and with ``topk`` = k the k most likely tokens at each position and their log-probs
    (its teacher side), both only where ``mask_BT`` is 1.

    The forward runs on the model's device (under ``model.autocast``); the B×T results come back
    on the CPU, where the objective is computed, and gradients flow back through the copy.
    """
    dev = _device(model)
    temp_B = torch.as_tensor(temperature, dtype=torch.float32).expand(ids_BT.shape[0])
    with autocast(model):  # bfloat16 products where ``model.autocast`` asks; the head stays float32
        out = _score_tokens(model, ids_BT.to(dev), attn_BT.to(dev), temp_B.to(dev), with_entropy,
                            None if mask_BT is None else mask_BT.to(dev), None if cand_BT is None else cand_BT.to(dev),
                            None if at_BTK is None else at_BTK.to(dev), topk)
    return TokenScores(*(None if x is None else x.cpu() for x in out))


def _device(model) -> torch.device:
    p = next(model.parameters(), None)
    return torch.device("cpu") if p is None else p.device


def _score_tokens(model, ids_BT, attn_BT, temp_B, with_entropy, mask_BT, cand_BT, at_BTK, topk):
    decoder = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if mask_BT is None or decoder is None or head is None:
        logits_BTV = model(input_ids=ids_BT, attention_mask=attn_BT).logits[:, :-1].float() / temp_B[:, None, None]
        sel_BT = torch.ones(logits_BTV.shape[:2], dtype=torch.bool, device=logits_BTV.device)
        if mask_BT is not None and (at_BTK is not None or topk):
            sel_BT = mask_BT > 0
        logits_NV = logits_BTV[sel_BT] if not bool(sel_BT.all()) else logits_BTV.reshape(-1, logits_BTV.shape[-1])
    else:
        sel_BT = mask_BT > 0
        # shard_model makes selected_logits a method FSDP treats as a forward: it gathers the root's weights
        forward = getattr(model, "selected_logits", functools.partial(selected_logits, model))
        logits_NV = forward(ids_BT, attn_BT, sel_BT).float() / temp_B[:, None].expand(sel_BT.shape)[sel_BT][:, None]
    lp_N, ent_N = token_logprobs_over(logits_NV, ids_BT[:, 1:][sel_BT], None if cand_BT is None else cand_BT[sel_BT],
                                      with_entropy)

    def scatter(x_N):  # N(×K) values back to B×T(×K), 0 where not selected
        if x_N is None:
            return None
        out = torch.zeros((*sel_BT.shape, *x_N.shape[1:]), dtype=x_N.dtype, device=sel_BT.device)
        return out.masked_scatter(sel_BT.view(*sel_BT.shape, *([1] * (x_N.dim() - 1))).expand_as(out), x_N)

    at_NK = top_ids_NK = top_lp_NK = None
    if at_BTK is not None or topk:
        logz_N1 = logits_NV.logsumexp(-1, keepdim=True)
        if at_BTK is not None:
            at_NK = logits_NV.gather(-1, at_BTK[sel_BT]) - logz_N1
        if topk:
            with torch.no_grad():
                top = logits_NV.detach().topk(min(topk, logits_NV.shape[-1]), dim=-1)
                top_ids_NK, top_lp_NK = top.indices, top.values - logz_N1.detach()
    return (scatter(lp_N), scatter(ent_N), scatter(at_NK), scatter(top_ids_NK), scatter(top_lp_NK))


class Trainer:
    """Optimizer steps on ``TrainingRow``s.

    On a model sharded by ``rlonce.train.distributed.shard_model`` the trainer is data-parallel:
    every rank makes the same calls with the same arguments but its own rows, and the update is
    the one a single process would make from all ranks' rows together. Aggregation weights and
    token shares take their denominators from the global mini-batch; the gradient is the sum
    over ranks; every rank runs the same number of micro-batches (padding with passes that train
    nothing); and the returned metrics are global. With ``minibatches > 1`` each rank splits its
    own rows by the same global assignment of whole prompt groups (``rank_splits``), and global
    mini-batch k is the union of every rank's k-th split. ``state_dict``
    then holds this rank's shard of the optimizer state.
    """

    def __init__(self, model, settings: OptimSettings, *, micro_batch_tokens: int = 2048, adapter=None):
        self.model, self.settings = model, settings
        self.micro_batch_tokens = micro_batch_tokens
        self.route_shape = moe.install(model)
        """A sparse model's routing: forwards replay the rows' recorded experts (``RLRequest.routing_replay``)
        and each RL step reports its expert load (``rlonce.model.moe``); None for a dense model."""
        if settings.freeze_router:
            if self.route_shape is None:
                raise ValueError("model.freeze_router is set but the model has no routers (it is dense); "
                                 "unset it or train a mixture-of-experts model")
            moe.freeze_routers(model)
        self._load: moe.Load | None = None
        self._replay, self._version = True, None
        self.adapter = adapter
        """With LoRA: the ``PeftModel`` around ``model`` (``LoadedModel.peft``); its frozen base,
        the adapters disabled, is the KL term's reference."""
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:  # under LoRA only the adapters (and modules_to_save) train
                (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
        self.group = data_parallel_group(model)
        # torch's fused kernel where it runs (the same update; on this CPU 4.6x faster than the default
        # per-tensor loop: SmolLM2-135M 98 ms against 455 ms a step); FSDP-sharded parameters keep the loop
        fused = self.group is None and all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda")
                                           for p in decay + no_decay)
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=settings.lr, betas=settings.betas, eps=settings.eps, fused=fused or None,
        )
        self.step = 0
        self.reference = None
        """The KL term's frozen reference policy, made at the first step with ``kl_coef`` > 0."""
        self.token_logprobs: list[torch.Tensor | None] = []
        """Per row of the last ``rl_step``: the log-probs its gradient was taken at (None: another rank's)."""

    def lr_at(self, step: int) -> float:
        s = self.settings
        if s.warmup_steps and step < s.warmup_steps:
            return s.lr * (step + 1) / s.warmup_steps
        if s.total_steps > 0:
            frac = min(1.0, (step - s.warmup_steps) / max(1, s.total_steps - s.warmup_steps))
            return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        return s.lr

    def _micro_batches(self, rows: list[TrainingRow]) -> list[list[int]]:
        return micro_batches(self.model, rows, self.micro_batch_tokens)

    def _optimizer_step(self, lr_scale: float = 1.0) -> float:
        """Clip, step at ``lr_at`` times ``lr_scale``, zero the gradients; the norm before clipping."""
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr_at(self.step) * lr_scale
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a DTensor when sharded

    def sft_step(self, rows: list[TrainingRow]) -> dict[str, float]:
        """One optimizer step of token-mean cross-entropy on the loss-masked tokens."""
        self.model.train()
        w_BT, _ = self._weights(rows, "token-mean")
        total = 0.0
        for idx in self._chunks(rows):
            if idx is None:
                self._idle_pass()
                continue
            b = pad_rows([rows[i] for i in idx])
            lp_BT, _ = token_logprobs(self.model, b.ids_BT, b.attn_BT, mask_BT=b.mask_BT)
            w = _slice_weights(w_BT, idx, lp_BT.shape[1])
            loss = -(w * lp_BT).sum()
            loss.backward()
            total += float(loss.detach())
        total = sum_over_ranks(self.group, {"sft_loss": total})["sft_loss"]
        norm = self._optimizer_step()
        return {"sft_loss": total, "grad_norm": norm, "lr": self.lr_at(self.step - 1)}

    def rl_step(self, rows: list[TrainingRow], request: RLRequest) -> dict[str, float]:
        """One RL update as ``request`` asks (``rlonce.train.request``, where each setting is
        explained): an optimizer step on each of its ``minibatches`` mini-batches of ``rows`` —
        per learning-rate scale, when sources set their own ``lr`` (``scaled_splits``). Metrics
        are token-weighted means over the step."""
        self.model.train()
        self._seen: dict[int, torch.Tensor] = {}
        self._replay, self._version = request.routing_replay, request.version
        self._load = moe.Load() if self.route_shape is not None else None
        if request.qdq_align and not mxfp4.align(self.model):
            raise ValueError("model.qdq_align with rollout_quant 'mxfp4' needs a mixture-of-experts model; this one "
                             "has no experts")
        try:
            return self._rl_step(rows, request)
        finally:
            if request.qdq_align:
                mxfp4.unalign(self.model)

    def _rl_step(self, rows: list[TrainingRow], request: RLRequest) -> dict[str, float]:
        """``rl_step`` under its routing and alignment."""
        aux: dict[str, list[torch.Tensor]] = {}
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        out: dict[str, float] = {}
        version = request.version
        if request.correction != "none":
            aux["old"] = self._recompute(rows)
            if version is not None:
                pairs = [same_version(r, aux["old"][i], version) for i, r in enumerate(rows)]
            rows, aux["corr"], counts = correct_rows(rows, aux["old"], mode=request.correction,
                                                     cap=request.correction_cap, bounds=request.geometric_bounds)
            out.update(correction_metrics(sum_over_ranks(self.group, counts)))
        if request.kl_coef > 0:
            with self._reference_model() as ref:
                aux["ref"] = self._recompute(rows, ref)
        splits = rank_splits(self.group, rows, request.minibatches, request.seed)
        loss_fn = functools.partial(policy_loss, request.objective, **request.params)
        sums: dict[str, float] = {}
        for k_split, (split, scale) in enumerate(splits):
            measure = k_split == 0 and "old" not in aux and version is not None
            stats = self._rl_minibatch([rows[i] for i in split], loss_fn, request.agg,
                                       aux={k: [v[i] for i in split] for k, v in aux.items()}, kl_coef=request.kl_coef,
                                       pairs=pairs if measure else None, version=version,
                                       topk_weight=request.topk_weight, lr_scale=scale)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
        out.update({k: v / len(splits) for k, v in sums.items()})
        self.token_logprobs = [self._seen.get(id(r)) for r in rows]  # rows keep their positions through correction
        out["lr"] = self.lr_at(self.step - 1)
        out["optimizer_steps"] = float(len(splits))  # more than rl.minibatches where sources set their own lr
        out.update(sum_over_ranks(self.group, {"trained_tokens": float(sum(sum(r.loss_mask) for r in rows))}))
        if version is not None:
            out.update(mismatch_metrics(cat_over_ranks(self.group, [p[0] for p in pairs]),
                                        cat_over_ranks(self.group, [p[1] for p in pairs])))
        if self._load is not None:
            out.update(self._load.metrics())
            self._load = None
        return out

    def _rl_minibatch(self, mb: list[TrainingRow], loss_fn, agg: str, *, aux: dict[str, list[torch.Tensor]],
                      kl_coef: float, pairs: list | None, version: int | None, topk_weight: float,
                      lr_scale: float) -> dict:
        """One optimizer step on the mini-batch ``mb``, accumulated micro-batch by micro-batch; its
        metrics (token-weighted, summed over ranks) and the gradient norm. ``aux``: per row of
        ``mb``, π_old ('old') and the correction's weights ('corr') when rollout correction is
        on, the reference log-probs ('ref') when ``kl_coef`` > 0. ``pairs``: where to collect the
        (rollout, trainer) log-probs of ``version``'s tokens from this forward, or None. With
        ``topk_weight`` > 0, rows with the teacher's top-k add ``topk_weight`` times its per-token
        KL (``rlonce.algo.losses.topk_kl``) under the same weights (metric ``distill_topk_kl``).
        ``lr_scale``: the mini-batch's learning rate over the schedule's (its rows' source ``lr``)."""
        w_BT, ntok = self._weights(mb, agg)
        stats: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
        for idx in self._chunks(mb):
            if idx is None:
                self._idle_pass()
                continue
            b = pad_rows([mb[i] for i in idx])
            topk = topk_weight > 0 and b.topk_ids_BTK is not None
            with self._routing(b, self._load, compare=[mb[i] for i in idx] if pairs is not None else None):
                sc = score_tokens(self.model, b.ids_BT, b.attn_BT, b.temp_B, with_entropy=True, mask_BT=b.mask_BT,
                                  cand_BT=b.cand_BT, at_BTK=b.topk_ids_BTK if topk else None)
            lp_BT, ent_BT = sc.lp_BT, sc.ent_BT
            for j, i in enumerate(idx):
                self._seen[id(mb[i])] = lp_BT[j, : len(mb[i]) - 1].detach()
                if pairs is not None:
                    pairs.append(same_version(mb[i], self._seen[id(mb[i])], version))
            w = _slice_weights(w_BT, idx, lp_BT.shape[1])
            x = {k: pad_like(b.mask_BT, [v[i] for i in idx]) for k, v in aux.items()}
            loss, m = loss_fn(lp_BT, x.get("old", b.old_lp_BT), b.adv_BT, b.mask_BT, weights_BT=w * x.get("corr", 1.0))
            if "ref" in x:
                kl_BT = kl_k3(lp_BT, x["ref"], b.mask_BT)
                loss = loss + kl_coef * (w * kl_BT).sum()
                m = {**m, "kl": float(kl_BT.detach().sum() / b.mask_BT.sum().clamp(min=1))}
            if topk:
                tk_BT = topk_kl(sc.at_BTK, b.topk_lp_BTK, b.mask_BT * b.topk_BT)
                loss = loss + topk_weight * (w * tk_BT).sum()
                m = {**m, "distill_topk_kl": float(tk_BT.detach().sum() / b.mask_BT.sum().clamp(min=1))}
            loss.backward()
            share = float(b.mask_BT.sum()) / max(ntok, 1.0)
            stats["loss"] += float(loss.detach())
            stats["entropy"] += float((ent_BT.detach() * b.mask_BT).sum()) / max(ntok, 1.0)
            for k, v in m.items():
                stats[k] = stats.get(k, 0.0) + v * share
        stats = sum_over_ranks(self.group, stats)
        stats["grad_norm"] = self._optimizer_step(lr_scale)
        return stats

    @torch.no_grad()
    def _recompute(self, rows: list[TrainingRow], model=None) -> list[torch.Tensor]:
        """Per row, the log-prob of each next token under the current weights, or ``model``'s
        (length len-1)."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(rows)
        for idx in self._chunks(rows):
            if idx is None:
                self._idle_pass(backward=False)
                continue
            b = pad_rows([rows[i] for i in idx])
            with self._routing(b, None if model is not None else self._load, count=False,
                               compare=[rows[i] for i in idx] if model is None else None):
                lp_BT, _ = token_logprobs(model or self.model, b.ids_BT, b.attn_BT, b.temp_B,
                                          mask_BT=b.mask_BT, cand_BT=b.cand_BT)
            for j, i in enumerate(idx):
                out[i] = lp_BT[j, : len(rows[i]) - 1].clone()
        return out

    def _routing(self, b: Batch, load: moe.Load | None = None, *, count: bool = True,
                 compare: list[TrainingRow] | None = None):
        """The routing of a sparse model's forward over ``b``: the rows' recorded experts replayed
        (when the step's request asks); into ``load``, the experts' token counts (``count``) and, on
        the forward at the rollout's weights (``compare``: ``b``'s rows, given for the forward
        ``mismatch_kl`` is measured on), how often the trainer's routers would have chosen otherwise
        in the rows sampled at the trainer's version — as ``mismatch_kl``, older rows are left out.
        Nothing for a dense model."""
        if self.route_shape is None:
            return contextlib.nullcontext()
        same = None if compare is None or self._version is None else torch.tensor(
            [all(v == self._version for v, m in zip(r.policy_versions, r.loss_mask) if m) for r in compare])
        return moe.replaying(b.routes_BTLK, b.attn_BT, replay=self._replay, load=load, count=count, compare_B=same)

    # ---- data parallelism: each helper is the single-process computation when not sharded ----
    def _weights(self, rows: list[TrainingRow], agg: str) -> tuple[torch.Tensor, float]:
        """Aggregation weights of ``rows`` (times each row's ``weight``) and the trained-token count.

        Data-parallel, both are taken over the global mini-batch: every rank's loss masks and
        group ids are gathered, so each denominator (tokens, sequences, groups, padded length)
        counts all ranks, and this rank keeps its own rows' weights."""
        if self.group is None:
            full = pad_rows(rows)
            w_BT = aggregation_weights(full.mask_BT, agg, group_ids_B=full.group_ids) * full.weight_B[:, None]
            return w_BT, float(full.mask_BT.sum())
        shards = gather(self.group, [(bytes(r.loss_mask[1:]), r.group_id) for r in rows])
        masks = [m for shard in shards for m, _ in shard]
        mask_BT = torch.zeros((len(masks), max(len(m) for m in masks)))
        for b, m in enumerate(masks):
            mask_BT[b, : len(m)] = torch.frombuffer(bytearray(m), dtype=torch.uint8)
        w_BT = aggregation_weights(mask_BT, agg, group_ids_B=[g for shard in shards for _, g in shard])
        start = sum(len(s) for s in shards[: dist.get_rank(self.group)])
        T = max((len(r) for r in rows), default=1) - 1
        weight_B = torch.tensor([r.weight for r in rows], dtype=torch.float32)
        return w_BT[start : start + len(rows), :T] * weight_B[:, None], float(mask_BT.sum())

    def _chunks(self, rows: list[TrainingRow]) -> list[list[int] | None]:
        """The micro-batches of ``rows``, padded with None to as many as any rank has."""
        chunks: list[list[int] | None] = list(self._micro_batches(rows))
        if self.group is None:
            return chunks
        return chunks + [None] * (max(gather(self.group, len(chunks))) - len(chunks))

    def _idle_pass(self, backward: bool = True) -> None:
        """A forward (and backward) that trains nothing, so that a rank with fewer micro-batches
        still joins each of FSDP's all-gathers and reduce-scatters."""
        ids_BT = torch.zeros((1, 2), dtype=torch.long)
        lp_BT, _ = token_logprobs(self.model, ids_BT, torch.ones_like(ids_BT), mask_BT=torch.ones((1, 1)))
        if backward:
            (lp_BT.sum() * 0.0).backward()

    # ---- state ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _reference_model(self):
        """The KL term's reference policy: with LoRA the frozen base itself, the adapters disabled
        while it scores (no copy); otherwise a frozen copy of the weights held now, made once."""
        if self.adapter is not None:
            with self.adapter.disable_adapter():
                yield self.model
            return
        if self.reference is None:
            if self.group is not None:
                raise ValueError("a KL term (algo.kl_coef > 0) keeps a reference copy in one trainer process; "
                                 "data-parallel trainers do not support it: use ray.trainer_workers = 1")
            self.reference = frozen_copy(self.model)
        yield self.reference

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "step": self.step}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
        if "reference" in state:
            self.reference = frozen_copy(self.model)
            self.reference.load_state_dict(state["reference"])


def mismatch_metrics(rollout_lp: torch.Tensor, train_lp: torch.Tensor) -> dict[str, float]:
    """Train/inference mismatch on the same sampled tokens (MiniMax-M1 §3.2, Fig. 3).

    ``mismatch_kl``: KL(μ‖π) estimated as mean(e^d − 1 − d), d = log π − log μ (non-negative, unbiased
    on tokens drawn from μ); ``mismatch_k1``: mean(log μ − log π); ``mismatch_corr``: Pearson
    correlation of the two token probabilities; ``mismatch_max_abs``: the largest |d|.
    """
    n = int(rollout_lp.numel())
    if n == 0:
        return {"mismatch_tokens": 0.0}
    d = (train_lp - rollout_lp).double()
    p, q = rollout_lp.double().exp(), train_lp.double().exp()
    corr = float(torch.corrcoef(torch.stack([p, q]))[0, 1]) if n > 1 and p.std() > 0 and q.std() > 0 else 1.0
    return {"mismatch_kl": float((d.exp() - 1 - d).mean()), "mismatch_k1": float(-d.mean()),
            "mismatch_corr": corr, "mismatch_max_abs": float(d.abs().max()), "mismatch_tokens": float(n)}


def _slice_weights(w_BT: torch.Tensor, idx: list[int], T: int) -> torch.Tensor:
    return w_BT[torch.tensor(idx), :T]
