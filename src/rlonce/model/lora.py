"""LoRA on the policy through ``peft``: adapters attached to a loaded model, adapter checkpoints,
and what a weight publish sends the engine (docs/lora.md).

The policy stays the model transformers loaded: ``get_peft_model`` injects its LoRA layers into
it in place, so every trainer forward (packed rows, selected logits) runs unchanged with the
adapters active. The ``PeftModel`` wrapper is kept beside it (``LoadedModel.peft``) for what only
it does: saving in peft's own format (``adapter_model.safetensors`` + ``adapter_config.json``) and
running the frozen base (``disable_adapter``), which is the KL term's reference — no copy of the
weights.

The engine decodes a plain model (its written-out Llama step reads each layer's ``weight``), so
it holds merged weights. A publish sends ``AdapterWeights``: each adapted layer's factors A and B
and its scale, the modules trained in full, and references to the trainer's frozen base weights
W0 (engine and trainer share one process: the references cost nothing and nothing of W0 is
copied). The engine writes W0 + scale·B·A into each adapted weight (``merge_into``): the merged
weights are a function of W0 and the current adapter alone, never an update accumulated over
publishes, so a resumed run's engine holds what the uninterrupted run's held. An engine in
another process (a Ray engine actor) is sent the factors alone (``AdapterWeights.base`` empty:
``adapter_weights(..., with_base=False)``) and keeps W0 of its own: it loads the base folder and
copies its adapted weights once, before it merges the first adapter (``TorchEngine.load_weights``).

Departure from peft's own merge: the sum is taken in float32 and rounded once to the weight's dtype.
"""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER = "default"
"""peft's name of the one adapter a model here carries."""


def is_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` is a peft adapter checkpoint (``adapter_config.json``), not a whole model."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model an adapter checkpoint was trained on (its ``base_model_name_or_path``)."""
    base = json.loads((Path(folder) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{Path(folder) / ADAPTER_CONFIG} names no base_model_name_or_path")
    return base


def attach(model, settings, base: str | Path):
    """Inject LoRA adapters as ``settings`` (``rlonce.config.LoraConfig``) asks into ``model`` in
    place; the ``PeftModel`` around it. ``base`` is recorded as the adapter's base model (what
    ``PeftModel.from_pretrained`` users load it on). Only the adapters and ``modules_to_save``
    train afterwards (peft sets ``requires_grad``)."""
    from peft import LoraConfig, get_peft_model

    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and settings.modules_to_save:
        raise ValueError(f"model.lora.modules_to_save = {list(settings.modules_to_save)} on a model whose embeddings "
                         "and head share one weight: the engine cannot load a separately trained copy of it; leave "
                         "modules_to_save empty")
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules),
                        modules_to_save=list(settings.modules_to_save) or None, task_type="CAUSAL_LM",
                        base_model_name_or_path=str(base))
    with warnings.catch_warnings():  # transformers' deprecation notices peft triggers
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, config)


def load_adapter(model, folder: str | Path, *, trainable: bool):
    """The adapter checkpoint in ``folder`` injected into ``model`` (its base) in place; the ``PeftModel``."""
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return PeftModel.from_pretrained(model, str(folder), is_trainable=trainable)


def merged(peft):
    """A plain model (no peft layers) whose weights are ``peft``'s base with its adapters merged in;
    ``peft`` itself is unchanged."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(peft).merge_and_unload()


@dataclass(frozen=True)
class AdapterWeights:
    """What a publish sends an engine under LoRA (keys are the plain model's parameter names)."""

    factors: dict
    """Per adapted weight: (A (r×in), B (out×r), scale); the layer's weight is W0 + scale·B·A."""
    full: dict
    """Parameters of ``modules_to_save``: trained in full, loaded as they are."""
    base: dict
    """Per adapted weight, W0: the trainer's frozen base tensor (a reference, never sent or copied)."""

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors the engine receives (A, B and the full ones; W0 is shared, not sent)."""
        tensors = [t for a, b, _ in self.factors.values() for t in (a, b)] + list(self.full.values())
        return sum(t.numel() * t.element_size() for t in tensors)


def adapter_weights(peft, *, with_base: bool = True) -> AdapterWeights:
    """``peft``'s current adapter as the engine takes it (``merge_into``); A, B and the full tensors
    are copies on the CPU, so the trainer may step while the engine still holds them. On a model
    sharded by FSDP2 every rank must call it (each factor is gathered whole, in the same order on
    every rank). ``with_base`` False leaves ``base`` empty: for an engine that holds W0 itself."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    factors, full, base = {}, {}, {}
    for name, m in peft.get_base_model().named_modules():
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A:
            if m.fan_in_fan_out or m.use_dora.get(ADAPTER, False):
                raise ValueError(f"{name}: only plain LoRA on Linear layers is published (no fan_in_fan_out, no DoRA)")
            key = f"{name}.weight"
            factors[key] = (_whole(m.lora_A[ADAPTER].weight), _whole(m.lora_B[ADAPTER].weight),
                            float(m.scaling[ADAPTER]))
            if with_base:
                base[key] = m.get_base_layer().weight.detach()
        elif isinstance(m, ModulesToSaveWrapper) and ADAPTER in m.modules_to_save:
            for pname, p in m.modules_to_save[ADAPTER].named_parameters():
                full[f"{name}.{pname}"] = _whole(p)
    return AdapterWeights(factors=factors, full=full, base=base)


def _whole(p):
    """A detached CPU copy of parameter ``p``, gathered from its shards when FSDP2 sharded it."""
    from torch.distributed.tensor import DTensor

    t = p.detach()
    return (t.full_tensor() if isinstance(t, DTensor) else t).cpu().clone()


def save_peft(weights: AdapterWeights, folder: str | Path, base: str) -> Path:
    """``weights``' factors as a peft adapter folder on ``base`` (``adapter_config.json`` through
    peft's ``LoraConfig``, ``adapter_model.safetensors`` under peft's saved names): what an engine
    that loads adapters itself (vLLM's ``LoRARequest``) reads. One rank and one scale for every
    layer, as ``model.lora`` makes them; ``full`` modules are refused (vLLM does not take them)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    if weights.full:
        raise ValueError("an adapter with modules_to_save cannot be saved for an engine that loads adapters")
    ranks = {a.shape[0] for a, _, _ in weights.factors.values()}
    scales = {scale for _, _, scale in weights.factors.values()}
    if len(ranks) != 1 or len(scales) != 1:
        raise ValueError(f"an adapter of one rank and scale is needed, got ranks {sorted(ranks)}, "
                         f"scales {sorted(scales)}")
    (rank,), (scale,) = ranks, scales
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    modules = sorted({key.removesuffix(".weight").rsplit(".", 1)[-1] for key in weights.factors})
    LoraConfig(r=rank, lora_alpha=scale * rank, target_modules=modules, task_type="CAUSAL_LM",
               base_model_name_or_path=str(base)).save_pretrained(str(folder))
    tensors = {}
    for key, (a, b, _) in weights.factors.items():
        name = "base_model.model." + key.removesuffix(".weight")
        tensors[f"{name}.lora_A.weight"], tensors[f"{name}.lora_B.weight"] = a.contiguous(), b.contiguous()
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    return folder


def own_base(model, weights: AdapterWeights) -> dict:
    """Copies of ``model``'s weights that ``weights`` adapts: an engine's own W0, taken while it still
    holds the base (``TorchEngine.load_weights``, before the first adapter is merged in)."""
    return {key: model.get_parameter(key).detach().clone() for key in weights.factors}


def merge_into(model, weights: AdapterWeights, base: dict | None = None) -> None:
    """Write ``weights`` into the plain ``model``: W0 + scale·B·A into each adapted weight (in
    float32, rounded once to the weight's dtype), the full tensors as they are. W0: ``base`` (the
    engine's own copy) or else ``weights.base`` (the trainer's, in the same process)."""
    import torch

    with torch.no_grad():
        for key, (a, b, scale) in weights.factors.items():
            w = model.get_parameter(key)
            w0 = (base if base is not None else weights.base)[key].to(device=w.device, dtype=torch.float32)
            w.copy_(torch.addmm(w0, b.to(w0), a.to(w0), alpha=scale).to(w.dtype))
        for key, t in weights.full.items():
            model.get_parameter(key).copy_(t)
