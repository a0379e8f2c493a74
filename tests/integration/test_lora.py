"""LoRA through peft on the embedded model: only the adapters train, a publish sends the adapter and
the engine merges it (its log-probs are the trainer's), the frozen base is the KL reference, and an
adapter checkpoint is peft's own format that plain peft loads to the trainer's log-probs."""

import asyncio
import dataclasses
import json

import pytest
import torch
from conftest import gen_many

from rlonce.config import ConfigError, load_config
from rlonce.engine.base import SamplingParams
from rlonce.engine.torch_engine import TorchEngine
from rlonce.model import lora
from rlonce.model.loader import ModelLoadError, load
from rlonce.train.trainer import OptimSettings, Trainer, mismatch_metrics, token_logprobs

PROMPTS = [[1, 50, 60, 70], [1, 80], [1, 90, 91, 92, 93, 94, 95], [1, 100, 101]]
RANK = 4


def _settings(*overrides: str):
    return load_config(None, [f"model.lora.rank={RANK}", "model.lora.alpha=8", *overrides]).model.lora


def _perturb(peft, seed: int = 0) -> None:
    """Non-zero adapters (peft starts B at 0, where the adapted model is the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


@pytest.fixture
def adapted(embedded_dir):
    return load(embedded_dir, lora_settings=_settings())


def _logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids))[0][0, len(prompt) - 1:]


def test_only_the_adapters_train_and_the_base_stays(adapted):
    """The optimizer holds the adapters alone (r·(in+out) per adapted layer, by hand below); two
    SFT steps on one row lower its loss and change every adapter matrix, and no base weight."""
    model = adapted.model
    trainer = Trainer(model, OptimSettings(lr=1e-2), adapter=adapted.peft)
    held = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    cfg = model.config
    kv = cfg.num_key_value_heads * cfg.head_dim
    h, ff = cfg.hidden_size, cfg.intermediate_size
    per_layer = RANK * ((h + h) * 2 + (h + kv) * 2 + (h + ff) * 2 + (ff + h))  # q, o; k, v; gate, up; down
    assert sum(p.numel() for p in held) == per_layer * cfg.num_hidden_layers
    assert {id(p) for p in held} == {id(p) for n, p in model.named_parameters() if "lora_" in n}
    from rlonce.core.records import TrainingRow

    ids = [1, 50, 60, 70, 80, 90, 100, 2]
    row = TrainingRow(ids, [0, 0, 1, 1, 1, 1, 1, 1], [0.0] * 8, [0.0] * 8, [-1, -1] + [0] * 6, group_id="g")
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    first = trainer.sft_step([row])["sft_loss"]
    second = trainer.sft_step([row])["sft_loss"]
    assert second < first
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in base.items())
    assert all(not torch.equal(after[n], v) for n, v in adapters.items())


def test_a_published_adapter_is_merged_and_the_engine_samples_the_trainers_policy(adapted):
    """The engine starts from the merged (zero-adapter) model; a publish sends A, B and the scale
    (its bytes: the adapter's, by hand) and the engine's log-probs of what it samples are the
    trainer's at the same weights: ``mismatch_kl`` < 1e-6."""
    peft = adapted.peft
    engine = TorchEngine(lora.merged(peft), eos_token_ids=adapted.eos_token_ids, pad_token_id=0, max_batch_size=8,
                         batch_wait_s=0.05)
    try:
        assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in
                   peft.get_base_model().state_dict().items() if ".base_layer." not in k and "lora_" not in k)
        _perturb(peft)
        weights = lora.adapter_weights(peft)
        lora_params = sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n)
        assert weights.nbytes == lora_params * 4 and not weights.full
        assert {s for _, _, s in weights.factors.values()} == {8 / RANK}
        engine.load_weights(weights, 3)
        key = "model.layers.1.mlp.down_proj.weight"
        a, b, s = weights.factors[key]
        want = weights.base[key] + s * b @ a
        assert torch.allclose(engine.model.state_dict()[key], want, atol=1e-6)
        gens = gen_many(engine, PROMPTS, [SamplingParams(max_tokens=12, seed=i) for i in range(4)])
        rollout, trained = [], []
        for p, g in zip(PROMPTS, gens):
            assert g.versions == [3] * len(g.token_ids)
            rollout.append(torch.tensor(g.logprobs))
            trained.append(_logprobs(adapted.model, p, g.token_ids))
        m = mismatch_metrics(torch.cat(rollout), torch.cat(trained))
        assert m["mismatch_tokens"] > 20 and 0 <= m["mismatch_kl"] < 1e-6, m
        # and the engine is not sampling the base: the adapter moves the log-probs
        with peft.disable_adapter():
            base_lp = torch.cat([_logprobs(adapted.model, p, g.token_ids) for p, g in zip(PROMPTS, gens)])
        assert (base_lp - torch.cat(trained)).abs().max() > 1e-3
    finally:
        engine.close()



def test_an_adapter_sent_without_its_base_merges_into_the_engines_own_copy(adapted, embedded_dir):
    """What a Ray engine actor receives: the factors alone (``with_base=False``, fewer bytes on the
    wire than the model by the base's size). The engine, built from the base folder, copies its
    adapted weights once before the first merge, and every later adapter is merged into that copy —
    a function of the base and the current adapter, equal to the in-process merge bit for bit."""
    peft = adapted.peft
    local = TorchEngine(lora.merged(peft), eos_token_ids=adapted.eos_token_ids, pad_token_id=0)
    remote = TorchEngine(load(embedded_dir).model, eos_token_ids=adapted.eos_token_ids, pad_token_id=0)
    try:
        for seed, version in ((0, 1), (1, 2)):
            _perturb(peft, seed)
            sent = lora.adapter_weights(peft, with_base=False)
            assert not sent.base and sent.nbytes == lora.adapter_weights(peft).nbytes
            remote.load_weights(sent, version)
            local.load_weights(lora.adapter_weights(peft), version)
            mine, theirs = remote.model.state_dict(), local.model.state_dict()
            assert all(torch.equal(mine[k], theirs[k]) for k in theirs), version
        base = load(embedded_dir).model.state_dict()
        assert set(remote._lora_base) == set(sent.factors)
        assert all(torch.equal(w0, base[k]) for k, w0 in remote._lora_base.items())  # not the merged weights
    finally:
        local.close()
        remote.close()

def test_the_kl_reference_is_the_frozen_base_without_a_copy(adapted, lm):
    """With kl_coef > 0 the reference log-probs are the base model's (the adapters disabled), and no
    reference copy of the weights is made."""
    from rlonce.core.records import TrainingRow
    from rlonce.train.builders import rl_request

    _perturb(adapted.peft, seed=1)
    trainer = Trainer(adapted.model, OptimSettings(lr=0.0), adapter=adapted.peft)
    ids = [1, 50, 60, 70, 80, 90, 100, 2]
    row = TrainingRow(ids, [0, 0, 1, 1, 1, 1, 1, 1], [0.0] * 8, [0.0, 0.0] + [0.5] * 6, [-1, -1] + [0] * 6,
                      group_id="g")
    with trainer._reference_model() as ref:
        assert ref is adapted.model
        (ref_lp,) = trainer._recompute([row], ref)
    (plain,) = trainer._recompute([row], lm.model)
    (policy,) = trainer._recompute([row])
    assert torch.allclose(ref_lp, plain, atol=1e-6)
    assert (policy - plain).abs().max() > 1e-3  # the adapters are back on after the reference scored
    m = trainer.rl_step([row], rl_request(load_config(None, ["algo.kl_coef=0.1"]), 1, 1, version=None))
    assert "kl" in m and m["kl"] > 0 and trainer.reference is None


def test_an_adapter_checkpoint_is_peft_format_and_loads_in_plain_peft(adapted, tmp_path):
    """checkpoint.save writes the adapter alone in peft's format, naming its base; plain peft
    (``PeftModel.from_pretrained`` on ``AutoModelForCausalLM``) gives the trainer's log-probs in
    float32, rlonce's loader the same with the adapter merged (eval, serve) or trainable (resume)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlonce.train import checkpoint

    _perturb(adapted.peft, seed=2)
    ckpt = checkpoint.save(tmp_path, 3, adapted, run_state={}, rl_trainer=None)
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.pt"} <= names
    assert not names & {"model.safetensors", "config.json"}
    assert lora.adapter_base(ckpt) == str(adapted.path.resolve())
    base = AutoModelForCausalLM.from_pretrained(lora.adapter_base(ckpt), dtype=torch.float32)
    plain = PeftModel.from_pretrained(base, str(ckpt)).eval()
    prompt, tokens = PROMPTS[2], [200, 201, 202, 203, 204, 205]
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        want = plain(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    ours, want = _logprobs(adapted.model, prompt, tokens), want[len(prompt) - 1:]
    assert torch.allclose(ours, want, atol=1e-6, rtol=1e-6), (ours - want).abs().max()  # float32 spacing at ~13
    merged = load(ckpt)  # no lora settings: a plain model, the adapter merged in
    assert merged.peft is None and not any("lora_" in n for n, _ in merged.model.named_parameters())
    assert torch.allclose(_logprobs(merged.model, prompt, tokens), ours, atol=1e-5, rtol=0)
    resumed = load(ckpt, lora_settings=_settings())
    assert resumed.peft is not None
    again = dict(resumed.model.named_parameters())
    assert all(torch.equal(again[n], p) for n, p in adapted.model.named_parameters() if "lora_" in n)
    assert again["model.layers.0.self_attn.q_proj.lora_A.default.weight"].requires_grad



def test_a_published_adapter_saved_for_an_adapter_loading_engine_is_the_trainers_policy(adapted, tmp_path):
    """What the vLLM engine writes for its ``LoRARequest`` on each publish (``lora.save_peft``: the
    factors under peft's names, rank and alpha from the scale): plain peft loads it on the base to
    the trainer's log-probs, and the safetensors hold the factors bit for bit."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    _perturb(adapted.peft, seed=4)
    sent = lora.adapter_weights(adapted.peft, with_base=False)
    folder = lora.save_peft(sent, tmp_path / "v7", str(adapted.path))
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (RANK, 8)
    assert sorted(config["target_modules"]) == sorted(_settings().target_modules)
    saved = load_file(folder / "adapter_model.safetensors")
    a, b, _ = sent.factors["model.layers.1.mlp.down_proj.weight"]
    assert torch.equal(saved["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"], a)
    assert torch.equal(saved["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"], b)
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapted.path, dtype=torch.float32),
                                      str(folder)).eval()
    prompt, tokens = PROMPTS[0], [210, 211, 212, 213]
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        want = plain(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    ours, want = _logprobs(adapted.model, prompt, tokens), want[len(prompt) - 1:]
    assert torch.allclose(ours, want, atol=1e-6, rtol=1e-6), (ours - want).abs().max()  # float32 spacing at ~13
    with pytest.raises(ValueError, match="modules_to_save"):
        lora.save_peft(dataclasses.replace(sent, full={"lm_head.weight": torch.zeros(1)}), tmp_path / "x", "b")
    from rlonce.engine.vllm_engine import vllm_lora_rank  # the engine's max_lora_rank: vLLM takes a few values

    assert [vllm_lora_rank(r) for r in (1, 4, 8, 12, 16, 64, 300)] == [1, 8, 8, 16, 16, 64, 320]

def test_lora_config_errors_are_one_line(embedded_dir):
    for overrides, words in [(["model.lora.rank=-1"], "model.lora.rank"),
                             (["model.lora.dropout=1"], "model.lora.dropout"),
                             (["model.lora.rank=8", "engine.backend=vllm", "model.lora.modules_to_save=[lm_head]"],
                              "vLLM's adapters hold LoRA factors only"),
                             (["model.lora.target_modules=[]"], "model.lora.target_modules"),
                             (["model.lora.ranks=8"], "known keys here: rank, alpha")]:
        with pytest.raises(ConfigError) as e:
            load_config(None, overrides)
        assert "\n" not in str(e.value) and words in str(e.value), str(e.value)
    for overrides, words in [(["model.lora.target_modules=[qkv]"], "qkv"),
                             (["model.lora.modules_to_save=[lm_head]"], "share one weight")]:
        with pytest.raises(ModelLoadError) as e:
            load(embedded_dir, lora_settings=_settings(*overrides))
        assert "\n" not in str(e.value) and words in str(e.value), str(e.value)


def test_the_local_backend_publishes_the_adapter_and_reports_its_bytes(adapted, embedded_dir):
    """The RL loop's path: LocalBackend's engine starts merged, ``publish`` returns the bytes one
    engine received — the adapter's under LoRA, the whole state dict without."""
    from rlonce.train.backend import LocalBackend
    from rlonce.train.builders import optim_settings
    from rlonce.train.checkpoint import tensor_bytes

    cfg = load_config(None, ["sft.demos=0", f"model.lora.rank={RANK}"])
    b = LocalBackend(cfg, adapted, embedded_dir, version=0, optim=optim_settings(cfg.rl))
    try:
        assert b.trainer.adapter is adapted.peft
        _perturb(adapted.peft, seed=3)
        sent = asyncio.run(b.publish(1))
        assert sent == sum(p.numel() * 4 for n, p in adapted.model.named_parameters() if "lora_" in n)
        assert b.engine.version == 1
        merged = lora.merged(adapted.peft).state_dict()
        assert all(torch.allclose(b.engine.model.state_dict()[k], v, atol=1e-6) for k, v in merged.items())
    finally:
        b.close()
    full = dataclasses.replace(load(embedded_dir))
    b = LocalBackend(load_config(None, ["sft.demos=0"]), full, embedded_dir, version=0, optim=optim_settings(cfg.rl))
    try:
        assert asyncio.run(b.publish(1)) == tensor_bytes(full.model.state_dict()) > 30 * sent
    finally:
        b.close()
