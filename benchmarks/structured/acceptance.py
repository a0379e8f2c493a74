"""Structured output through the gateway, counted: for each protocol, N requests for JSON under a
schema and N forced tool calls (``required``/``any`` and a named tool), sent with the official
openai and anthropic SDKs to a model served as ``rlonce serve`` serves it (the torch engine with its
tokenizer, real HTTP on loopback); a reply counts as valid when it parses and ``jsonschema``
accepts it (a tool call: exactly one call, of an allowed tool, its arguments valid against that
tool's parameters). The issue's acceptance bar is N of N on every line (docs/gateway.md).

    python benchmarks/structured/acceptance.py --models embedded smollm2 --n 100 --out runs/bench/structured

Writes ``results.json`` and ``results.md`` (one table) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VERDICT = {"type": "object", "additionalProperties": False, "required": ["verdict", "score", "reason"],
           "properties": {"verdict": {"enum": ["pass", "fail"]},
                          "score": {"type": "integer", "minimum": 0, "maximum": 10},
                          "reason": {"type": "string", "maxLength": 60}}}
BASH = {"type": "object", "properties": {"command": {"type": "string", "maxLength": 60}}, "required": ["command"],
        "additionalProperties": False}
READ = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40},
                                         "line": {"type": "integer", "minimum": 1, "maximum": 9999}},
        "required": ["path", "line"], "additionalProperties": False}
TOOLS = {"bash": BASH, "read": READ}
TOPICS = ["the build", "the failing test", "the config loader", "the README", "the release notes", "the CLI",
          "the parser", "the cache", "the logging", "the scheduler"]


def _valid(value, schema) -> bool:
    import jsonschema

    try:
        jsonschema.validate(value, schema)
        return True
    except jsonschema.ValidationError:
        return False


def _json_text(text: str | None, schema) -> bool:
    try:
        return _valid(json.loads(text or ""), schema)
    except json.JSONDecodeError:
        return False


def _call_ok(calls: list[tuple[str, object]], allowed: set[str]) -> bool:
    """Exactly one call, of an allowed tool, arguments (a JSON string or an object) valid against it."""
    if len(calls) != 1:
        return False
    name, args = calls[0]
    if name not in allowed:
        return False
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return False
    return _valid(args, TOOLS[name])


FAILED: list[dict] = []
"""The replies that were not valid (each line's first few), for results.json."""


def _noted(ok: bool, what: str, i: int, reply) -> bool:
    if not ok and sum(f["what"] == what for f in FAILED) < 5:
        FAILED.append({"what": what, "request": i, "reply": str(reply)[:1500]})
    return ok


def cases(url: str, max_tokens: int):
    """(protocol, ask, one request i -> valid?) for every line of the table."""
    import anthropic
    import openai

    def oa():
        return openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=2)

    def an(key):
        return anthropic.Anthropic(base_url=url, api_key=key, max_retries=2)

    def ask(i):
        return f"Review {TOPICS[i % len(TOPICS)]} (case {i}) and report."

    def hdr(tag, i):
        return {"authorization": f"Bearer {tag}-{i}"}

    chat_tools = [{"type": "function", "function": {"name": n, "description": f"the {n} tool", "parameters": s}}
                  for n, s in TOOLS.items()]
    resp_tools = [{"type": "function", "name": n, "description": f"the {n} tool", "parameters": s, "strict": True}
                  for n, s in TOOLS.items()]
    ant_tools = [{"name": n, "description": f"the {n} tool", "input_schema": s} for n, s in TOOLS.items()]

    def chat_json(i):
        r = oa().chat.completions.create(model="m", messages=[{"role": "user", "content": ask(i)}], seed=i,
                                         max_tokens=max_tokens, extra_headers=hdr("cj", i), response_format={
                                             "type": "json_schema",
                                             "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}})
        return _noted(_json_text(r.choices[0].message.content, VERDICT), "chat json_schema", i, r)

    def resp_json(i):
        r = oa().responses.create(model="m", input=ask(i), max_output_tokens=max_tokens, extra_headers=hdr("rj", i),
                                  text={"format": {"type": "json_schema", "name": "verdict", "schema": VERDICT,
                                                   "strict": True}})
        return _noted(_json_text(r.output_text, VERDICT), "responses json_schema", i, r)

    def ant_json(i):
        r = an(f"aj-{i}").messages.create(model="m", max_tokens=max_tokens,
                                          messages=[{"role": "user", "content": ask(i)}],
                                          output_config={"format": {"type": "json_schema", "schema": VERDICT}})
        return _noted(len(r.content) == 1 and r.content[0].type == "text" and _json_text(r.content[0].text, VERDICT),
                      "messages json_schema", i, r)

    def chat_tool(choice, allowed):
        def one(i):
            r = oa().chat.completions.create(model="m", messages=[{"role": "user", "content": ask(i)}], seed=i,
                                             max_tokens=max_tokens, tools=chat_tools, tool_choice=choice,
                                             extra_headers=hdr(f"ct{len(allowed)}", i))
            calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]
            return _noted(_call_ok(calls, allowed), f"chat {choice}", i, r)
        return one

    def resp_tool(choice, allowed):
        def one(i):
            r = oa().responses.create(model="m", input=ask(i), max_output_tokens=max_tokens, tools=resp_tools,
                                      tool_choice=choice, extra_headers=hdr(f"rt{len(allowed)}", i))
            calls = [(o.name, o.arguments) for o in r.output if o.type == "function_call"]
            return _noted(_call_ok(calls, allowed) and len(r.output) == 1, f"responses {choice}", i, r)
        return one

    def ant_tool(choice, allowed):
        def one(i):
            r = an(f"at{len(allowed)}-{i}").messages.create(
                model="m", max_tokens=max_tokens, messages=[{"role": "user", "content": ask(i)}], tools=ant_tools,
                tool_choice=choice)
            calls = [(b.name, b.input) for b in r.content if b.type == "tool_use"]
            return _noted(_call_ok(calls, allowed) and len(r.content) == 1 and r.stop_reason == "tool_use",
                          f"messages {choice}", i, r)
        return one

    every = set(TOOLS)
    return [
        ("openai-chat", "json_schema", chat_json),
        ("openai-responses", "json_schema", resp_json),
        ("anthropic-messages", "json_schema", ant_json),
        ("openai-chat", "required", chat_tool("required", every)),
        ("openai-responses", "required", resp_tool("required", every)),
        ("anthropic-messages", "required (any)", ant_tool({"type": "any"}, every)),
        ("openai-chat", "named", chat_tool({"type": "function", "function": {"name": "read"}}, {"read"})),
        ("openai-responses", "named", resp_tool({"type": "function", "name": "read"}, {"read"})),
        ("anthropic-messages", "named (tool)", ant_tool({"type": "tool", "name": "read"}, {"read"})),
    ]


def write(out: Path, args, rows: list[dict]) -> None:
    """Both files, rewritten after every line (a run cut short keeps what it measured)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                  "rows": rows, "invalid": FAILED}, indent=1))
    (out / "results.md").write_text(table(rows))


def run_model(name: str, n: int, concurrency: int, max_tokens: int, done) -> list[dict]:
    import torch

    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.http import ServerThread, make_app
    from rlonce.gateway.session import GatewaySettings
    from rlonce.model import loader
    from rlonce.model.chat import get_format

    torch.set_num_threads(max(1, torch.get_num_threads()))
    lm = loader.load(loader.resolve(name, Path("runs/bench/structured-cache")))
    pad = lm.tokenizer.pad_token_id
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=pad if pad is not None else 0,
                         tokenizer=lm.tokenizer)
    gw = Gateway(GatewaySettings.serving(engine=engine, encode=lm.encode, decode=lm.decode,
                                         fmt=get_format(lm.chat_format), model_name=name, max_tokens=max_tokens,
                                         max_context=4096, offload=ThreadPoolExecutor(2), tokenizer=lm.tokenizer))
    rows = []
    try:
        with ServerThread(make_app(gw)) as srv, ThreadPoolExecutor(concurrency) as pool:
            for protocol, ask, one in cases(srv.base_url, max_tokens):
                t = time.perf_counter()
                ok = list(pool.map(one, range(n)))
                rows.append({"model": name, "protocol": protocol, "ask": ask, "valid": sum(ok), "n": n,
                             "seconds": round(time.perf_counter() - t, 1)})
                print(json.dumps(rows[-1]), flush=True)
                done(rows[-1])
    finally:
        engine.close()
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | protocol | asked | valid | seconds |", "|---|---|---|---|---|"]
    out += [f"| {r['model']} | {r['protocol']} | {r['ask']} | {r['valid']} / {r['n']} | {r['seconds']} |"
            for r in rows]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["embedded", "smollm2"])
    ap.add_argument("--n", type=int, default=100, help="requests per protocol and ask")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight (the engine batches them)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows: list[dict] = []

    def done(row: dict) -> None:
        rows.append(row)
        write(args.out, args, rows)

    for m in args.models:
        run_model(m, args.n, args.concurrency, args.max_tokens, done)
    print(table(rows))


if __name__ == "__main__":
    main()
