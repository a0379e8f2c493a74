"""Model loading: the embedded tiny decoder and any local Hugging Face model folder.

Everything loads through ``AutoModelForCausalLM``/``AutoTokenizer`` from a folder on disk —
the embedded model too: ``materialize_embedded`` writes its config, the shipped tokenizer
and chat template, and deterministically initialised weights to a folder, which is then
loaded exactly as a pretrained model would be.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

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


class ModelLoadError(RuntimeError):
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
    weights (``python -m rlonce.model.pretrain`` made them) — to ``dest`` as a model folder."""
    dest = Path(dest)
    if (dest / "model.safetensors").exists():
        return dest
    weights = EMBEDDED_DIR / "model.safetensors"
    if not weights.is_file():
        raise ModelLoadError(f"the embedded weights {weights} are missing; rebuild them with "
                             "`python -m rlonce.model.pretrain`")
    _copy_tokenizer(dest)
    _embedded_config().save_pretrained(dest)
    shutil.copy(weights, dest / "model.safetensors")
    return dest


def resolve(name_or_path: str, cache_dir: str | Path) -> Path:
    """``embedded`` → a materialised folder under ``cache_dir``; otherwise an existing folder."""
    if name_or_path == "embedded":
        return materialize_embedded(Path(cache_dir) / "embedded-init")
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model {name_or_path!r} is neither 'embedded' nor a folder; pass a local "
                             "Hugging Face model folder (config.json + weights + tokenizer)")
    return path


def load(path: str | Path, *, chat_format: str | None = None) -> LoadedModel:
    """Load model and tokenizer from a local folder, with a one-line error if it does not load."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json; it is not a Hugging Face model folder")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        AutoConfig.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - every loader failure becomes one clear line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"could not load the model in {path}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if chat_format is None:
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        chat_format = cfg.get("chat_format", "hermes")
    return LoadedModel(model, tokenizer, path, chat_format)
