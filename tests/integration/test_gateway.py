"""The gateway over real HTTP on loopback, driven by the official openai and anthropic SDKs.

Each protocol (streaming and not) completes a toolfind task in a real bubblewrap sandbox with
a scripted deterministic model; after every turn the recorded trajectory is fetched over HTTP
and its last model segment compared with what the engine sampled, token for token.
"""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from rlonce.core.records import Role
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.toolfind import verify
from rlonce.envs.toolfind.env import SYSTEM_PROMPT, ToolfindEnv
from rlonce.envs.toolfind.expert import optimal_calls
from rlonce.envs.toolfind.tasks import make_task
from rlonce.envs.workspace import BASH_TOOL, SUBMIT_TOOL
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import ServerThread, make_app
from rlonce.gateway.session import Budgets, GatewaySettings
from rlonce.model.chat import get_format

pytestmark = pytest.mark.sandbox
FMT = get_format("hermes")
ADMIN = {"authorization": "Bearer test-admin-key"}
"""The trainer's key: the trajectory, reward and re-render routes need it."""
TOOLS = [BASH_TOOL, SUBMIT_TOOL]


class Recording:
    """Wraps an engine and keeps every (prompt, generation) it served."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = []

    @property
    def version(self):
        return self.engine.version

    async def generate(self, prompt_ids, sampling, watch=None):
        gen = await self.engine.generate(prompt_ids, sampling, watch)
        self.calls.append((list(prompt_ids), gen))
        return gen


def check_last_turn(base_url, sid, engine):
    """The trajectory's newest model segment is exactly the engine's last generation, and the
    prompt the engine saw is exactly the recorded context before it."""
    traj = httpx.get(f"{base_url}/sessions/{sid}/trajectory", headers=ADMIN).json()
    prompt, gen = engine.calls[-1]
    for ctx in traj["contexts"]:
        ids = [t for s in ctx["segments"] for t in s["token_ids"]]
        last = ctx["segments"][-1]
        if last["role"] == "model" and last["token_ids"] == gen.token_ids and ids[:len(prompt)] == prompt:
            assert last["logprobs"] == gen.logprobs and last["versions"] == gen.versions
            assert len(ids) == len(prompt) + len(gen.token_ids)
            break
    else:
        raise AssertionError("no context ends with the engine's last generation")
    for ctx in traj["contexts"]:
        for s in ctx["segments"]:
            assert (s["logprobs"] is None) == (s["role"] != "model")  # observations carry no loss
    return traj


@pytest.fixture()
def served(lm):
    def start(turns, **kw):
        engine = Recording(ScriptedEngine(turns, lm.encode))
        gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=FMT,
                                     sampling=SamplingParams(max_tokens=64), auto_open=True, tokenizer=lm.tokenizer,
                                     offload=ThreadPoolExecutor(4), **kw))
        srv = ServerThread(make_app(gw, admin_key="test-admin-key")).start()
        started.append(srv)
        return gw, engine, srv.base_url

    started = []
    yield start
    for s in started:
        s.stop()


def _task_env(idx):
    task = make_task("heldout", idx)
    env = ToolfindEnv(task)
    asyncio.run(env.setup())
    return task, env


def _bash(env, args):
    return asyncio.run(env.call_tool("bash", args))


def _script(task):
    return [FMT.assistant_text("Searching.", [c]) for c in optimal_calls(task)]


def chat_episode(base, sid, engine, env, task, stream):
    client = openai.OpenAI(base_url=f"{base}/sessions/{sid}/v1", api_key="unused", max_retries=0)
    tools = [{"type": "function", "function": t} for t in TOOLS]
    msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]
    while True:
        if stream:
            with client.chat.completions.stream(model="policy", messages=msgs, tools=tools) as s:
                msg = s.get_final_completion().choices[0].message
        else:
            msg = client.chat.completions.create(model="policy", messages=msgs, tools=tools).choices[0].message
        check_last_turn(base, sid, engine)
        assert msg.content == "Searching."
        msgs.append({"role": "assistant", "content": msg.content, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in msg.tool_calls]})
        call = msg.tool_calls[0]
        args = json.loads(call.function.arguments)
        if call.function.name == "submit":
            return args["answer"]
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": _bash(env, args)})


def responses_episode(base, sid, engine, env, task, stream):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=sid, max_retries=0)  # the key names the session
    tools = [{"type": "function", **t} for t in TOOLS]
    items, prev = [{"role": "user", "content": task.question}], None
    while True:
        kw = {"model": "policy", "instructions": SYSTEM_PROMPT, "input": items, "tools": tools}
        if prev:
            kw["previous_response_id"] = prev
        if stream:
            with client.responses.stream(**kw) as s:
                r = s.get_final_response()
        else:
            r = client.responses.create(**kw)
        check_last_turn(base, sid, engine)
        assert r.output_text == "Searching."
        call = next(o for o in r.output if o.type == "function_call")
        args = json.loads(call.arguments)
        if call.name == "submit":
            return args["answer"]
        prev, items = r.id, [{"type": "function_call_output", "call_id": call.call_id, "output": _bash(env, args)}]


def anthropic_episode(base, sid, engine, env, task, stream):
    client = anthropic.Anthropic(base_url=base, api_key=sid, max_retries=0)
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
    msgs = [{"role": "user", "content": task.question}]
    while True:
        kw = {"model": "policy", "max_tokens": 256, "system": SYSTEM_PROMPT, "messages": msgs, "tools": tools}
        if stream:
            with client.messages.stream(**kw) as s:
                m = s.get_final_message()
        else:
            m = client.messages.create(**kw)
        check_last_turn(base, sid, engine)
        assert m.content[0].text == "Searching." and m.stop_reason == "tool_use"
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        use = next(b for b in m.content if b.type == "tool_use")
        if use.name == "submit":
            return use.input["answer"]
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": _bash(env, use.input)}]})


EPISODES = {"chat": (chat_episode, False), "chat-stream": (chat_episode, True),
            "responses": (responses_episode, False), "responses-stream": (responses_episode, True),
            "anthropic": (anthropic_episode, False), "anthropic-stream": (anthropic_episode, True)}


@pytest.mark.parametrize("mode", list(EPISODES))
def test_sdk_completes_a_task_with_exact_tokens(served, lm, mode):
    task, env = _task_env(list(EPISODES).index(mode) + 3)
    gw, engine, base = served(_script(task))
    episode, stream = EPISODES[mode]
    try:
        answer = episode(base, "s-" + mode, engine, env, task, stream)
    finally:
        asyncio.run(env.cleanup())
    assert verify.score(task.answer, answer) == 1.0
    r = httpx.post(f"{base}/sessions/s-{mode}/reward", json={"reward": 1.0}, headers=ADMIN)
    assert r.status_code == 200
    traj = httpx.get(f"{base}/sessions/s-{mode}/trajectory", headers=ADMIN).json()
    assert traj["reward"] == 1.0 and traj["events"] == [] and len(traj["contexts"]) == 1
    segs = traj["contexts"][0]["segments"]
    assert [s["role"] for s in segs] == ["prompt"] + ["model", "observation"] * (len(engine.calls) - 1) + ["model"]
    assert [s["token_ids"] for s in segs if s["role"] == "model"] == [g.token_ids for _, g in engine.calls]
    # the trained tokens are what was sampled; a re-render through the template agrees here
    report = httpx.get(f"{base}/sessions/s-{mode}/rerender", headers=ADMIN).json()["contexts"][0]
    assert report["first_divergence"] is None and report["model_tokens_changed"] == 0


def _free_turns(base, sid, mode, n):
    """``n`` turns of whatever the model says, through the SDK of ``mode``; tool calls get a reply."""
    tools = [{"type": "function", "function": t} for t in TOOLS]
    if mode.startswith("chat"):
        c = openai.OpenAI(base_url=f"{base}/v1", api_key=sid, max_retries=0)
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "What is x?"}]
        for _ in range(n):
            if mode == "chat-stream":
                with c.chat.completions.stream(model="embedded", messages=msgs, tools=tools) as s:
                    s.until_done()
                    msg = s.current_completion_snapshot.choices[0].message
            else:
                msg = c.chat.completions.create(model="embedded", messages=msgs, tools=tools).choices[0].message
            yield
            msgs.append(msg.model_dump(exclude_none=True, exclude={"parsed"}))
            ids = [t.id for t in msg.tool_calls or []] or [None]
            msgs += [{"role": "tool", "tool_call_id": i, "content": "no such file"} for i in ids]
    elif mode.startswith("responses"):
        c = openai.OpenAI(base_url=f"{base}/v1", api_key=sid, max_retries=0)
        kw = {"model": "embedded", "instructions": SYSTEM_PROMPT, "input": "What is x?",
              "tools": [{"type": "function", **t} for t in TOOLS]}
        for _ in range(n):
            r = c.responses.create(**kw, stream=True) if mode == "responses-stream" else c.responses.create(**kw)
            if mode == "responses-stream":
                r = [e for e in r if e.type in ("response.completed", "response.incomplete")][-1].response
            yield
            calls = [o for o in r.output if o.type == "function_call"]
            kw.update(previous_response_id=r.id, input=[{"type": "function_call_output", "call_id": o.call_id,
                                                         "output": "no such file"} for o in calls]
                      or [{"role": "user", "content": "go on"}])
    else:
        a = anthropic.Anthropic(base_url=base, api_key=sid, max_retries=0)
        atools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
        msgs = [{"role": "user", "content": "What is x?"}]
        for _ in range(n):
            kw = {"model": "embedded", "max_tokens": 24, "system": SYSTEM_PROMPT, "messages": msgs, "tools": atools}
            if mode == "anthropic-stream":
                with a.messages.stream(**kw) as s:
                    m = s.get_final_message()
            else:
                m = a.messages.create(**kw)
            yield
            msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
            uses = [b for b in m.content if b.type == "tool_use"]
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "none"}
                                                     for u in uses] or "go on"})


def test_embedded_model_over_http_records_sampled_log_probs(lm):
    """The real embedded model behind the gateway, through every SDK mode: each turn is recorded
    with the engine's own log-probs and versions, and each next prompt extends the recorded context."""
    from rlonce.engine.torch_engine import TorchEngine

    engine = Recording(TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=0, seed=0, version=3))
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=FMT,
                                 sampling=SamplingParams(max_tokens=24), auto_open=True, offload=ThreadPoolExecutor(4)))
    try:
        with ServerThread(make_app(gw, admin_key="test-admin-key")) as srv:
            for mode in EPISODES:
                for _ in _free_turns(srv.base_url, "emb-" + mode, mode, 2):
                    traj = check_last_turn(srv.base_url, "emb-" + mode, engine)
                model = [s for c in traj["contexts"] for s in c["segments"] if s["role"] == "model"]
                assert len(model) == 2 and all(v == 3 for s in model for v in s["versions"]), mode
                assert all(lp <= 0 for s in model for lp in s["logprobs"]), mode
    finally:
        engine.engine.close()
    assert len(engine.calls) == 2 * len(EPISODES)


# ---- rollback, branch, truncation, flags: the in-process path, same bodies -----------------

def _gw(lm, turns, **kw):
    engine = Recording(ScriptedEngine(turns, lm.encode))
    settings = GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=FMT,
                               sampling=SamplingParams(max_tokens=64), **kw)
    return Gateway(settings), engine


def _chat(gw, sid, msgs):
    return asyncio.run(gw.call("openai-chat", {"messages": msgs, "tools": [{"type": "function", "function": t}
                                                                          for t in TOOLS]}, sid))


def _ask(lm, n_turns=3, **kw):
    turns = [FMT.assistant_text(f"step {i}", [optimal_calls(make_task("train", 1))[0]]) for i in range(n_turns)]
    gw, engine = _gw(lm, turns + [FMT.assistant_text("again", [])] * 4, **kw)
    s = gw.open("x")
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for i in range(2):
        msg = _chat(gw, "x", msgs)["choices"][0]["message"]
        msgs += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"out {i}"}]
    return gw, engine, s, msgs


def test_editing_the_last_assistant_turn_rolls_back_and_counts_what_was_cut(lm):
    gw, engine, s, msgs = _ask(lm)
    ctx = s.contexts[0]
    second = [seg for seg in ctx.segments if seg.role is Role.MODEL][1]
    edited = msgs[:4] + [{"role": "assistant", "content": "an edited turn"}, {"role": "user", "content": "go on"}]
    _chat(gw, "x", edited)
    assert s.events[-1]["kind"] == "rollback" and s.events[-1]["dropped_model_tokens"] == len(second.token_ids)
    assert s.rollback_dropped_tokens == len(second.token_ids) and len(s.contexts) == 1
    roles = [seg.role for seg in ctx.segments]
    assert roles == [Role.PROMPT, Role.MODEL, Role.OBSERVATION, Role.MODEL]
    # the edited assistant text lives in the observation delta, with no loss on it
    assert "an edited turn" in lm.decode(ctx.segments[2].token_ids) and ctx.segments[2].logprobs is None
    prompt, gen = engine.calls[-1]
    assert ctx.token_ids() == prompt + gen.token_ids


def test_rewriting_earlier_history_opens_a_new_context_and_keeps_the_old(lm):
    gw, engine, s, msgs = _ask(lm)
    before = list(s.contexts[0].token_ids())
    compacted = [msgs[0], {"role": "user", "content": "task\n\nSummary of earlier work: out 0, out 1"}]
    _chat(gw, "x", compacted)
    assert [e["kind"] for e in s.events] == ["branch"] and len(s.contexts) == 2
    old, new = s.contexts
    assert old.token_ids() == before  # untouched, still trained as it was sampled
    assert new.label == "branch-1" and new.segments[0].role is Role.PROMPT
    assert "Summary of earlier work" in lm.decode(new.segments[0].token_ids)
    prompt, gen = engine.calls[-1]
    assert new.token_ids() == prompt + gen.token_ids
    # a request extending the OLD context still finds it
    _chat(gw, "x", msgs)
    assert len(s.contexts) == 2 and len([g for g in old.segments if g.role is Role.MODEL]) == 3


def test_dropping_content_from_an_early_turn_branches_rather_than_cutting_trained_turns(lm):
    gw, engine, s, msgs = _ask(lm)
    stripped = [dict(m) for m in msgs]
    stripped[2] = {**stripped[2], "content": ""}  # a client that drops earlier assistant text
    _chat(gw, "x", stripped)
    assert s.events[-1]["kind"] == "branch" and s.rollback_dropped_tokens == 0


def test_trajectory_budget_truncates_and_ends_the_session(lm):
    gw, engine = _gw(lm, [FMT.assistant_text("x" * 200, [])] * 3, budgets=Budgets(64, 120))
    gw.open("t")
    r = _chat(gw, "t", [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}])
    assert r["choices"][0]["finish_reason"] == "length"
    s = gw.sessions["t"]
    assert s.status == "truncated" and s.events[-1]["kind"] == "truncated"
    assert len(s.contexts[0]) <= 120
    from rlonce.gateway.messages import ProtocolError

    with pytest.raises(ProtocolError) as e:
        _chat(gw, "t", [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}])
    assert e.value.status == 409


def test_malformed_and_unknown_tool_calls_are_flagged_and_answered_as_text(lm):
    gw, _ = _gw(lm, ["<tool_call>\n{oops}\n</tool_call><|im_end|>",
                     '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call><|im_end|>'])
    gw.open("f")
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    m1 = _chat(gw, "f", msgs)["choices"][0]
    assert m1["finish_reason"] == "stop" and "tool_calls" not in m1["message"] and "{oops}" in m1["message"]["content"]
    m2 = _chat(gw, "f", msgs + [m1["message"], {"role": "user", "content": "use a real tool"}])["choices"][0]
    assert "tool_calls" not in m2["message"]
    flags = [seg.flags for seg in gw.sessions["f"].contexts[0].segments if seg.role is Role.MODEL]
    assert flags == [{"malformed_tool_call": True}, {"unknown_tool": True}]
    assert gw.sessions["f"].events == []  # the echoed text matched the recorded turn: no rollback


def test_rerender_report_finds_non_canonical_sampled_tokens(lm):
    """A model may sample 'grep' as 'gr' + 'ep'; re-tokenizing the text would train on other tokens."""
    from rlonce.gateway.fidelity import rerender_report

    class Splitting(ScriptedEngine):
        async def generate(self, prompt_ids, sampling):
            gen = await super().generate(prompt_ids, sampling)
            text = lm.decode(gen.token_ids)
            cut = text.index("grep") + 2
            ids = lm.encode(text[:cut]) + lm.encode(text[cut:])
            gen.token_ids, gen.logprobs, gen.versions = ids, [0.0] * len(ids), [0] * len(ids)
            return gen

    call = optimal_calls(make_task("train", 1))[0]
    gw = Gateway(GatewaySettings(engine=Splitting([FMT.assistant_text("", [call])], lm.encode), encode=lm.encode,
                                 decode=lm.decode, fmt=FMT, sampling=SamplingParams(max_tokens=64)))
    gw.open("r")
    _chat(gw, "r", [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}])
    rep = rerender_report(gw.sessions["r"], lm.tokenizer)[0]
    assert rep["first_divergence"] is not None and rep["model_tokens_changed"] > 0
    assert rep["recorded_tokens"] != rep["rerendered_tokens"]


def test_bad_requests_get_protocol_shaped_4xx_and_leave_the_session_intact(served, lm):
    gw, engine, base = served([FMT.assistant_text("ok", [])] * 4)
    h = {"authorization": "Bearer b", "content-type": "application/json"}
    good = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    assert httpx.post(f"{base}/v1/chat/completions", json=good, headers=h).status_code == 200
    before = gw.sessions["b"].export()
    bad = [
        ("/v1/chat/completions", b"{not json"), ("/v1/chat/completions", b"[1, 2]"),
        ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode()),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode()),
        ("/v1/chat/completions", json.dumps({**good, "max_tokens": -3}).encode()),
        ("/v1/chat/completions", json.dumps({**good, "temperature": "hot"}).encode()),
        ("/v1/chat/completions", json.dumps({**good, "tools": [{"type": "function", "function": {}}]}).encode()),
        ("/v1/chat/completions", json.dumps({**good, "n": 3}).encode()),
        ("/v1/chat/completions", b'{"messages": NaN}'),
        ("/v1/messages", json.dumps({"messages": [{"role": "user", "content": [{"text": 1}]}]}).encode()),
        ("/v1/messages", json.dumps({"messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "name": "x", "input": "[1]"}]}]}).encode()),
        ("/v1/responses", json.dumps({"input": 5}).encode()),
        ("/v1/responses", json.dumps({"input": "hi", "previous_response_id": "resp_nope"}).encode()),
        ("/v1/chat/completions", b"x" * (5 << 20)),
    ]
    for path, body in bad:
        r = httpx.post(base + path, content=body, headers=h)
        assert 400 <= r.status_code < 500, (path, body[:80], r.status_code, r.text)
        err = r.json()
        if path == "/v1/messages":
            assert err["type"] == "error" and err["error"]["message"]
        else:
            assert err["error"]["message"] and err["error"]["type"]
    assert httpx.post(f"{base}/v1/chat/completions", json=good).status_code == 401  # no key
    assert httpx.get(f"{base}/sessions/nope/trajectory", headers=ADMIN).status_code == 404
    assert httpx.post(f"{base}/sessions/b/reward", json={"reward": "high"}, headers=ADMIN).status_code == 400
    assert gw.sessions["b"].export() == before  # nothing refused touched the session
    r = httpx.post(f"{base}/v1/chat/completions?api-version=2024&x=1", json=good, headers=h)
    assert r.status_code == 200  # query strings are tolerated
    models = httpx.get(f"{base}/v1/models").json()
    assert models["data"][0]["id"] == gw.settings.model_name


def test_unknown_sessions_are_refused_unless_the_gateway_opens_them(lm):
    gw, _ = _gw(lm, [FMT.assistant_text("ok", [])], offload=ThreadPoolExecutor(4))
    with ServerThread(make_app(gw)) as srv:
        r = httpx.post(f"{srv.base_url}/sessions/ghost/v1/messages", headers={"x-api-key": "k"},
                       json={"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404 and r.json()["type"] == "error"


def test_step_hash_assignment_is_shared_by_siblings_and_spread_over_arms():
    from rlonce.harness.arms import ARMS, arm_for

    arms = list(ARMS)
    picks = [arm_for(0, 1, f"task-{i}", arms) for i in range(400)]
    assert all(100 - 40 < picks.count(a) < 100 + 40 for a in arms)
    assert arm_for(0, 1, "task-7", arms) == arm_for(0, 1, "task-7", arms)
    assert [arm_for(0, r, "task-7", arms) for r in range(12)] != [picks[7]] * 12  # rounds reshuffle
