"""What a client reads about the sampled tokens and the turn's end: log-probs (Chat Completions,
Responses), Anthropic's streamed usage, a Responses item cut by ``max_output_tokens``. Real HTTP
on loopback and the official SDKs; the numbers are the session's recorded log-probs, and the
top alternatives are checked against the embedded model's own distribution, computed here.
"""

import json

import anthropic
import httpx
import openai
import pytest
import torch
from test_gateway_streaming import FMT, Dripping, _gateway

from rlonce.engine.torch_engine import TorchEngine
from rlonce.gateway.http import ServerThread, make_app

ASK = [{"role": "user", "content": "Find the file that holds the word ember."}]
TEMPERATURE = 0.7


def _model_segment(gw, key):
    prompt, model = gw.sessions[key].contexts[0].segments[-2:]
    assert model.role.value == "model"
    return prompt, model


def _reference_logp(lm, prompt_ids, token_ids):
    """Log-probs of the sampling distribution (temperature only) at each sampled position, by one
    plain forward of the model over prompt and turn."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = lm.model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    return (logits / TEMPERATURE).log_softmax(-1)


def _check_entries(lm, entries, prompt, model, top_n, with_bytes=True):
    """Each entry is the recorded token and log-prob; its alternatives are the model's ``top_n``
    most likely tokens with their log-probs."""
    assert len(entries) == len(model.token_ids) > 0
    ref = _reference_logp(lm, prompt.token_ids, model.token_ids)
    for i, (e, t, lp) in enumerate(zip(entries, model.token_ids, model.logprobs)):
        assert e.token == lm.decode([t]) and e.logprob == lp  # exactly what the session recorded
        if with_bytes:
            assert bytes(e.bytes) == e.token.encode()
        assert lp == pytest.approx(ref[i, t].item(), abs=2e-3)
        want_v, want_ids = ref[i].topk(top_n)
        assert [a.token for a in e.top_logprobs] == [lm.decode([a]) for a in want_ids.tolist()]
        assert [a.logprob for a in e.top_logprobs] == pytest.approx(want_v.tolist(), abs=2e-3)
        assert all(x.logprob >= y.logprob for x, y in zip(e.top_logprobs, e.top_logprobs[1:]))


@pytest.fixture()
def torch_served(lm):
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=0, seed=1)
    gw = _gateway(lm, engine)
    try:
        with ServerThread(make_app(gw)) as srv:
            yield gw, srv.base_url
    finally:
        engine.close()


def test_chat_logprobs_are_the_recorded_ones_with_the_models_top_alternatives(lm, torch_served):
    gw, base = torch_served
    for key in ("plain", "stream", "without"):
        gw.open(key, key=key, seed=5)
    kw = dict(model="m", messages=ASK, max_tokens=12, temperature=TEMPERATURE)
    chat = openai.OpenAI(base_url=base + "/v1", api_key="plain", max_retries=0).chat.completions
    got = chat.create(logprobs=True, top_logprobs=3, **kw).choices[0].logprobs.content
    _check_entries(lm, got, *_model_segment(gw, "plain"), 3)

    chat = openai.OpenAI(base_url=base + "/v1", api_key="stream", max_retries=0).chat.completions
    streamed = [e for c in chat.create(stream=True, logprobs=True, top_logprobs=2, **kw)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    _check_entries(lm, streamed, *_model_segment(gw, "stream"), 2)

    chat = openai.OpenAI(base_url=base + "/v1", api_key="without", max_retries=0).chat.completions
    assert chat.create(**kw).choices[0].logprobs is None  # not asked: null, as the real API
    # asking for them changes nothing sampled: the same seed draws the same tokens
    turns = [_model_segment(gw, k)[1] for k in ("plain", "stream", "without")]
    assert turns[0].token_ids == turns[1].token_ids == turns[2].token_ids
    assert turns[0].logprobs == pytest.approx(turns[2].logprobs, abs=1e-5)


def test_responses_logprobs_in_the_output_text_part(lm, torch_served):
    gw, base = torch_served
    gw.open("plain", key="plain", seed=5)
    gw.open("stream", key="stream", seed=5)
    kw = dict(model="m", input=ASK, max_output_tokens=12, temperature=TEMPERATURE,
              include=["message.output_text.logprobs"], top_logprobs=2)
    resp = openai.OpenAI(base_url=base + "/v1", api_key="plain", max_retries=0).responses.create(**kw)
    msg = next(o for o in resp.output if o.type == "message")
    _check_entries(lm, msg.content[0].logprobs, *_model_segment(gw, "plain"), 2)

    client = openai.OpenAI(base_url=base + "/v1", api_key="stream", max_retries=0)
    events = list(client.responses.create(stream=True, **kw))  # the stream helper wants 'completed'; this is cut
    done = [e for e in events if e.type == "response.output_text.done"]
    final = events[-1].response
    assert events[-1].type == "response.incomplete"
    msg = next(o for o in final.output if o.type == "message")
    prompt, model = _model_segment(gw, "stream")
    _check_entries(lm, msg.content[0].logprobs, prompt, model, 2)
    assert [e.logprob for e in done[0].logprobs] == model.logprobs


def test_an_engine_without_alternatives_lists_the_sampled_token(lm):
    text = "one two three" + FMT.turn_end
    gw = _gateway(lm, Dripping(text, lm.encode, gap=0.0))
    with ServerThread(make_app(gw)) as srv:
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", headers={"authorization": "Bearer d"},
                       json={"model": "m", "messages": ASK, "logprobs": True, "top_logprobs": 4}).json()
        ids = lm.encode(text)
        assert r["choices"][0]["logprobs"]["content"] == [
            {"token": lm.decode([t]), "logprob": 0.0, "bytes": list(lm.decode([t]).encode()),
             "top_logprobs": [{"token": lm.decode([t]), "logprob": 0.0, "bytes": list(lm.decode([t]).encode())}]}
            for t in ids]
        bad = httpx.post(f"{srv.base_url}/v1/chat/completions", headers={"authorization": "Bearer d2"},
                         json={"model": "m", "messages": ASK, "logprobs": True, "top_logprobs": 21})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_logprobs"


def _events(raw: str) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]


def test_anthropic_streamed_usage_counts_input_and_output_tokens(lm):
    gw = _gateway(lm, Dripping("one two three four five" + FMT.turn_end, lm.encode, gap=0.0))
    with ServerThread(make_app(gw)) as srv:
        headers = {"x-api-key": "raw", "anthropic-version": "2023-06-01"}
        raw = httpx.post(f"{srv.base_url}/v1/messages", headers=headers,
                         json={"model": "m", "max_tokens": 50, "messages": ASK, "stream": True}).text
        prompt, model = _model_segment(gw, "raw")
        ev = {e["type"]: e for e in _events(raw)}
        assert ev["message_start"]["message"]["usage"] == {
            "input_tokens": len(prompt.token_ids), "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": 0}
        assert ev["message_delta"]["usage"] == {  # cumulative, as the real API sends it
            "input_tokens": len(prompt.token_ids), "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": len(model.token_ids)}
        assert len(prompt.token_ids) > 5 and len(model.token_ids) > 3

        client = anthropic.Anthropic(base_url=srv.base_url, api_key="sdk", max_retries=0)
        with client.messages.stream(model="m", max_tokens=50, messages=ASK) as s:
            deltas = [e.usage for e in s if e.type == "message_delta"]
            usage = s.get_final_message().usage
        prompt, model = _model_segment(gw, "sdk")
        assert usage.input_tokens == deltas[0].input_tokens == len(prompt.token_ids) > 0
        assert usage.output_tokens == deltas[0].output_tokens == len(model.token_ids)


def test_a_responses_item_cut_by_max_output_tokens_is_incomplete(lm):
    text = "one two three four five six seven eight" + FMT.turn_end
    gw = _gateway(lm, Dripping(text, lm.encode, gap=0.0))
    with ServerThread(make_app(gw)) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="cut", max_retries=0)
        resp = client.responses.create(model="m", input=ASK, max_output_tokens=3)
        assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
        assert [(o.type, o.status) for o in resp.output] == [("message", "incomplete")]
        assert len(_model_segment(gw, "cut")[1].token_ids) == 3

        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="cut-stream", max_retries=0)
        events = list(client.responses.create(model="m", input=ASK, max_output_tokens=3, stream=True))
        done = [e.item.status for e in events if e.type == "response.output_item.done"]
        final = events[-1].response
        assert done == ["incomplete"] and events[-1].type == "response.incomplete" and final.status == "incomplete"
        assert [(o.type, o.status) for o in final.output] == [("message", "incomplete")]

        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="whole", max_retries=0)
        resp = client.responses.create(model="m", input=ASK, max_output_tokens=50)
        assert resp.status == "completed" and [o.status for o in resp.output] == ["completed"]
