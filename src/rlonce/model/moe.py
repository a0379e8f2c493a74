"""Sparse (mixture-of-experts) models: their routers, rollout routing replay (R3), router freezing
and expert-load statistics.

A sparse layer's router picks, per token, the k experts it runs (a top-k of its logits). The
engine and the trainer compute the same logits only up to round-off, and a token whose k-th and
(k+1)-th logits are close can go to different experts in the two — a different function, not a
rounding difference: R3's paper (Ma et al. 2025, from Xiaomi) measured about 10 % of routers
choosing differently between rollout and training, and replay roughly halving the train/inference
KL. MiMo-V2.6 lists "MoE routing replay" among the two things it aligns (seed 000).

**Recording.** ``install`` puts a forward hook on every router (transformers' ``*TopKRouter``
modules: the ``gate`` of a block that also has ``experts``; their forward returns router logits,
the top-k gate weights and the top-k expert indices). Inside ``recording()`` the hook keeps each
call's expert indices; the torch engine runs its prefill and decode steps inside it and gives
every answer the experts of every position it ran (``Generation.routes``: prompt and sampled
tokens but the last, which was never run), kept caches carrying theirs.

**Replay.** Inside ``replaying(routes_BTLK, attn_BT)`` (the trainer's forwards) the hook replaces
each position's chosen experts by the recorded ones where a position has them (``-1``: none; the
router's own choice stands) and recomputes the gate weights from the trainer's own router logits
at those experts — softmax over all experts, gathered at the recorded k, renormalised where the
router renormalises (``norm_topk_prob``; Mixtral always). Recomputing rather than replaying the
weights keeps the router in the gradient (replayed constants would give it none), and at identical
weights the recomputed values equal the rollout's bit for bit. The hook maps the router's rows to
batch positions through the packed layout when the forward is packed (``rlonce.model.packing``).

**Statistics.** ``Load`` counts, per layer, the tokens routed to each expert in a step's
training forwards (real tokens only, after replay), and how many recorded (token, layer) pairs
the trainer's own router would have sent to a different expert set than the rollout did, on the
forward at the rollout's weights and in the rows sampled at them (later mini-batches of a step
run on updated weights, and an older row was sampled under other ones: there a different choice
is an update's doing) — replay on or off, so a run with replay off measures what replay would fix.

Routes are stored as unsigned integers (uint8 up to 256 experts, else uint16): ``layers · k``
bytes a token for the usual model.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import numpy as np
import torch

_STATE: contextvars.ContextVar[_Recorder | _Replay | None] = contextvars.ContextVar("rlonce_moe", default=None)
COLD_SHARE = 0.1
"""An expert is cold in a step when it took less than this share of its layer's mean load."""


@dataclass(frozen=True)
class Shape:
    """A sparse model's routing: how many sparse layers, experts per layer, and experts per token."""

    layers: int
    experts: int
    k: int

    @property
    def dtype(self):
        """The unsigned integer type routes are stored in."""
        return np.uint8 if self.experts <= 256 else np.uint16

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.k * np.dtype(self.dtype).itemsize


def routers(model) -> list[torch.nn.Module]:
    """The routers of ``model``'s sparse layers, in layer order: the ``gate`` of every module that
    also holds ``experts``, when the gate has an integer ``top_k``. Empty for a dense model."""
    found = []
    for mod in model.modules():
        gate = getattr(mod, "gate", None)
        if isinstance(gate, torch.nn.Module) and hasattr(mod, "experts") and isinstance(getattr(gate, "top_k", None),
                                                                                         int):
            found.append(gate)
    return found


def shape(model) -> Shape | None:
    """``model``'s routing shape, or None for a dense model."""
    gates = routers(model)
    if not gates:
        return None
    experts = {_experts(g) for g in gates}
    ks = {g.top_k for g in gates}
    if len(experts) > 1 or len(ks) > 1:
        raise ValueError(f"sparse layers differ in experts {sorted(experts)} or top-k {sorted(ks)}: routing replay "
                         "stores one shape per model")
    return Shape(len(gates), experts.pop(), ks.pop())


def _experts(gate) -> int:
    n = getattr(gate, "num_experts", None)
    return int(n) if n is not None else int(gate.weight.shape[0])


def install(model) -> Shape | None:
    """Hook ``model``'s routers (once; later calls change nothing) so that ``recording`` and
    ``replaying`` reach them; its shape, or None for a dense model."""
    gates = routers(model)
    for layer, gate in enumerate(gates):
        if getattr(gate, "_rlonce_layer", None) is None:
            gate._rlonce_layer = layer
            gate.register_forward_hook(_hook)
    return shape(model) if gates else None


def freeze_routers(model) -> int:
    """Keep the routers out of training (``model.freeze_router``): their weights stop requiring a
    gradient, so the optimizer never holds them and they stay bit-identical. How many were frozen."""
    gates = routers(model)
    for gate in gates:
        for p in gate.parameters():
            p.requires_grad_(False)
    return len(gates)


def _hook(gate, args, output):
    state = _STATE.get()
    if state is None:
        return None
    return state.on_router(gate, output)


# ---- recording (the engine) ---------------------------------------------------------------------
class _Recorder:
    def __init__(self):
        self.calls: dict[int, list[torch.Tensor]] = {}

    def on_router(self, gate, output):
        self.calls.setdefault(gate._rlonce_layer, []).append(output[2].detach())
        return None

    def take(self, B: int, T: int) -> np.ndarray:
        """The experts of the last forward, (B, T, layers, k), as int64; cleared after."""
        layers = [self.calls[i].pop() for i in sorted(self.calls)]
        self.calls.clear()
        idx = torch.stack([x.reshape(B, T, -1) for x in layers], dim=2)
        return idx.cpu().numpy()


@contextlib.contextmanager
def recording():
    """Within this block, every hooked router keeps its chosen experts; ``take(B, T)`` after a
    forward of B×T tokens gives them."""
    rec = _Recorder()
    token = _STATE.set(rec)
    try:
        yield rec
    finally:
        _STATE.reset(token)


# ---- replay and statistics (the trainer) ----------------------------------------------------------
@dataclass
class Load:
    """A step's expert-load and routing-mismatch counts over the training forwards it covered."""

    counts: dict[int, torch.Tensor] = field(default_factory=dict)
    """Per layer: tokens routed to each expert (k per token)."""
    differ: dict[int, int] = field(default_factory=dict)
    """Per layer: recorded tokens the trainer's own router sent to another expert set, on the
    forward at the rollout's weights (the one the train/inference mismatch is measured on)."""
    compared: dict[int, int] = field(default_factory=dict)
    """Per layer: tokens with a recorded routing."""

    def add(self, layer: int, idx_MK: torch.Tensor | None, experts: int, own_MK: torch.Tensor | None,
            want_MK: torch.Tensor | None, have_M: torch.Tensor | None) -> None:
        """Count the experts ``idx_MK`` took (None: none counted) and, where ``have_M``, how many of
        the routers' own choices ``own_MK`` differ from the recorded ``want_MK``."""
        if idx_MK is not None:
            c = torch.bincount(idx_MK.reshape(-1).cpu(), minlength=experts).to(torch.float64)
            self.counts[layer] = self.counts.get(layer, 0) + c
        if have_M is not None and bool(have_M.any()):
            own, want = own_MK[have_M].sort(-1).values, want_MK[have_M].sort(-1).values
            self.differ[layer] = self.differ.get(layer, 0) + int((own != want).any(-1).sum())
            self.compared[layer] = self.compared.get(layer, 0) + int(have_M.sum())

    def metrics(self) -> dict[str, float]:
        """Per layer ``moe/l{i}/load_cv`` (the coefficient of variation of the experts' token
        counts), ``moe/l{i}/load_peak`` (the busiest expert over the mean), ``moe/l{i}/cold`` (the
        share of experts under ``COLD_SHARE`` of the mean) and ``moe/l{i}/route_differ`` (the share
        of recorded tokens whose expert set the trainer's router would change); ``moe/…`` without a
        layer: their mean over layers (``route_differ`` over all recorded tokens)."""
        out: dict[str, float] = {}
        per: dict[str, list[float]] = {"load_cv": [], "load_peak": [], "cold": []}
        for layer in sorted(self.counts):
            c = self.counts[layer]
            mean = float(c.mean())
            if mean <= 0:
                continue
            vals = {"load_cv": float(c.std(unbiased=False)) / mean, "load_peak": float(c.max()) / mean,
                    "cold": float((c < COLD_SHARE * mean).double().mean())}
            for k, v in vals.items():
                out[f"moe/l{layer}/{k}"] = v
                per[k].append(v)
        for k, vs in per.items():
            if vs:
                out[f"moe/{k}"] = sum(vs) / len(vs)
        compared = sum(self.compared.values())
        if compared:
            for layer in sorted(self.compared):
                out[f"moe/l{layer}/route_differ"] = self.differ[layer] / max(self.compared[layer], 1)
            out["moe/route_differ"] = sum(self.differ.values()) / compared
        return out


class _Replay:
    def __init__(self, routes_BTLK: torch.Tensor | None, real_BT: torch.Tensor, replay: bool, load: Load | None,
                 count: bool, compare_BT: torch.Tensor | None):
        self.routes_BTLK, self.real_BT, self.replay, self.load = routes_BTLK, real_BT, replay, load
        self.count, self.compare_BT = count, compare_BT

    def _rows(self, x_BT: torch.Tensor, M: int) -> torch.Tensor:
        """``x_BT`` (B, T, …) at the M positions a router saw, in its order."""
        from rlonce.model.packing import current_layout

        B, T = x_BT.shape[:2]
        flat = x_BT.reshape(B * T, *x_BT.shape[2:])
        layout = current_layout()
        if layout is not None and layout.index_N.numel() == M:
            return flat.index_select(0, layout.index_N.to(flat.device))
        if M == B * T:
            return flat
        raise RuntimeError(f"routing replay: a router saw {M} tokens in a forward of {B}x{T} positions")

    def on_router(self, gate, output):
        logits_MX, scores_MK, own_MK = output
        layer, M = gate._rlonce_layer, own_MK.shape[0]
        real_M = self._rows(self.real_BT, M).to(own_MK.device)
        want_MK = have_M = None
        if self.routes_BTLK is not None:
            want_MK = self._rows(self.routes_BTLK[:, :, layer], M).to(own_MK.device)
            have_M = (want_MK >= 0).all(-1) & real_M
        idx_MK = own_MK
        if self.replay and have_M is not None and bool(have_M.any()):
            idx_MK = torch.where(have_M[:, None], want_MK, own_MK)
            probs_MX = torch.softmax(logits_MX.float(), dim=-1)
            w_MK = probs_MX.gather(-1, idx_MK)
            if getattr(gate, "norm_topk_prob", True):
                w_MK = w_MK / w_MK.sum(-1, keepdim=True)
            scores_MK = w_MK.to(scores_MK.dtype)
        if self.load is not None:
            compared_M = None if have_M is None or self.compare_BT is None else have_M & self._rows(self.compare_BT, M)
            self.load.add(layer, idx_MK.detach()[real_M] if self.count else None, _experts(gate), own_MK.detach(),
                          want_MK, compared_M)
        return (logits_MX, scores_MK, idx_MK) if idx_MK is not own_MK else None


@contextlib.contextmanager
def replaying(routes_BTLK: torch.Tensor | None, attn_BT: torch.Tensor, *, replay: bool = True,
              load: Load | None = None, count: bool = True, compare_B: torch.Tensor | None = None):
    """Within this block, forwards of the B×T batch ``attn_BT`` describes route each position
    with a recorded routing (``routes_BTLK``: B×T×layers×k expert ids, -1 where none) to the
    recorded experts when ``replay``; into ``load`` they count each expert's tokens (``count``)
    and, in the rows ``compare_B`` marks (None: none), the recorded tokens the routers would have
    sent elsewhere."""
    real_BT = attn_BT.bool()
    compare_BT = None if compare_B is None else compare_B.bool()[:, None].expand_as(real_BT)
    token = _STATE.set(_Replay(routes_BTLK, real_BT, replay, load, count, compare_BT))
    try:
        yield
    finally:
        _STATE.reset(token)
