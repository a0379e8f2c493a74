"""The shipped sparse embedded model, ``embedded-moe``: its architecture, its weights, its name."""

import json

import pytest
import torch

from rlonce.envs.toolfind.env import SYSTEM_PROMPT
from rlonce.model import loader
from rlonce.model.chat import get_format


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return loader.resolve("embedded-moe", tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def moe(moe_dir):
    return loader.load(moe_dir)


def test_resolve_names_the_moe_folder(moe_dir, tmp_path):
    assert moe_dir.name == "embedded-moe-init"
    cfg = json.loads((moe_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["architectures"] == ["Qwen3MoeForCausalLM"]
    fresh = loader.resolve("embedded-moe", tmp_path)
    assert fresh == tmp_path / "embedded-moe-init" and (fresh / "model.safetensors").is_file()
    assert "embedded-moe" in loader.NAMED


def test_every_layer_routes_each_token_to_two_of_eight_experts(moe):
    from transformers import Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    model = moe.model
    assert isinstance(model, Qwen3MoeForCausalLM)
    assert len(model.model.layers) == 4
    for layer in model.model.layers:
        assert isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)
        assert (layer.mlp.gate.num_experts, layer.mlp.gate.top_k) == (8, 2)
        assert layer.mlp.experts.gate_up_proj.shape == (8, 2 * 128, 192)
        assert layer.mlp.experts.down_proj.shape == (8, 192, 128)
    # the embedded model's vocabulary, special ids and tied head
    dense = loader.EMBEDDED_ARCH
    for key in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(model.config, key) == dense[key], key
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    # hidden 192: embeddings 896×192; per layer attention 2×192² + 2×64×192 + norms, 8 experts of
    # 3×192×128, a router of 8×192
    per_layer = 2 * 192 * 192 + 2 * 64 * 192 + 2 * 32 + 2 * 192 + 8 * 3 * 192 * 128 + 8 * 192
    assert sum(p.numel() for p in model.parameters()) == 896 * 192 + 4 * per_layer + 192


def test_shipped_weights_fill_every_parameter(moe_dir):
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(moe_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_missing_weights_name_the_rebuild_command(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "EMBEDDED_DIR", tmp_path / "empty")
    with pytest.raises(loader.ModelLoadError, match=r"python -m rlonce.recipes.pretrain --model embedded-moe"):
        loader.materialize_embedded(tmp_path / "out", moe=True)


def test_greedy_generation_is_deterministic_and_matches_full_forwards(moe):
    prompt = moe.encode(get_format(moe.chat_format).opening(SYSTEM_PROMPT, "What is the color of falcon?", []))
    ids = torch.tensor([prompt])
    runs = [moe.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                               pad_token_id=moe.tokenizer.pad_token_id)[0, len(prompt):].tolist() for _ in range(2)]
    assert runs[0] == runs[1]
    seq = list(prompt)
    with torch.no_grad():
        for _ in runs[0]:  # each token is the argmax of a whole-sequence forward, without the cache
            seq.append(int(moe.model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    assert seq[len(prompt):len(prompt) + len(runs[0])] == runs[0]
