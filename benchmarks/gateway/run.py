"""Gateway-added latency per turn: over HTTP versus in-process, at 1 and 32 concurrent sessions.

    python benchmarks/gateway/run.py --out DIR [--turns 8] [--repeats 3]

Each session is an 8-turn tool-calling conversation in OpenAI Chat Completions form (the
client re-sends the whole history every turn, as real clients do), answered by a scripted
model whose generation costs nothing, so the time measured is the gateway's: parsing,
prefix matching, delta encoding, recording, rendering the reply — plus, over HTTP, FastAPI,
uvicorn, the hops to the server's parsing/tokenizing executor and the httpx client on loopback
(the HTTP clients run in a separate process, as an outside agent would). The engine-only time
of the same turns is measured alongside. In-process and HTTP runs alternate within each repeat.
p50/p95 per turn, the HTTP / in-process ratios and turns/s go to ``results.json``,
``results.md`` and ``gateway.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Endless:
    """A free scripted model: the same tool-calling turn, forever."""

    def __init__(self, ids):
        self.ids = ids
        self.version = 0

    async def generate(self, prompt_ids, sampling, watch=None):
        from rlonce.engine.base import Generation, watch_after

        return watch_after(Generation(list(self.ids), [0.0] * len(self.ids), [0] * len(self.ids), "stop"), watch)


def make_gateway(lm, offload=None):
    from rlonce.engine.base import SamplingParams
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.session import Budgets, GatewaySettings
    from rlonce.model.chat import ToolCall, get_format

    fmt = get_format("hermes")
    ids = lm.encode(fmt.assistant_text("Looking.", [ToolCall("bash", {"command": "grep -r falcon.color docs"})]))
    return Gateway(GatewaySettings(engine=Endless(ids), encode=lm.encode, decode=lm.decode, fmt=fmt,
                                   sampling=SamplingParams(max_tokens=64), budgets=Budgets(64, 1 << 20), auto_open=True,
                                   offload=offload)), ids


TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                            "parameters": {"type": "object",
                                                           "properties": {"command": {"type": "string"}}}}}]


async def conversation(send, turns: int, lat: list[float]) -> None:
    msgs = [{"role": "system", "content": "Answer from the files in docs/."},
            {"role": "user", "content": "What is the color of falcon?"}]
    for i in range(turns):
        t0 = time.perf_counter()
        r = await send({"model": "policy", "messages": msgs, "tools": TOOLS})
        lat.append(time.perf_counter() - t0)
        msg = r["choices"][0]["message"]
        msgs += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                       "content": f"docs/birds.txt:falcon.color = red ({i})"}]


async def run_mode(mode: str, gw, base_url: str, sessions: int, turns: int, tag: str) -> tuple[list[float], float]:
    import httpx

    lat: list[float] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
        def sender(sid: str):
            if mode == "in-process":
                return lambda body: gw.call("openai-chat", body, sid)

            async def send(body):
                r = await client.post(f"{base_url}/sessions/{sid}/v1/chat/completions", json=body,
                                      headers={"authorization": f"Bearer {sid}"})  # the key that owns it
                r.raise_for_status()
                return r.json()
            return send

        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(sender(f"{tag}-{mode}-{k}"), turns, lat) for k in range(sessions)))
        wall = time.perf_counter() - t0
    return lat, wall


def http_load(base_url: str, sessions: int, turns: int, tag: str) -> tuple[list[float], float]:
    """The HTTP clients, in a separate process: an outside agent is another process too."""
    return asyncio.run(run_mode("http", None, base_url, sessions, turns, tag))


async def engine_only(gw, n: int) -> list[float]:
    from rlonce.engine.base import SamplingParams

    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await gw.settings.engine.generate([1, 2, 3], SamplingParams())
        out.append(time.perf_counter() - t0)
    return out


def model_turn(lm, n: int = 5) -> list[float]:
    """A real turn of the embedded model at batch 1 (32 tokens): what the gateway's cost compares with."""
    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine

    engine = TorchEngine(lm.model, eos_token_ids=[], pad_token_id=0, seed=0)
    prompt = lm.encode("<|im_start|>system\nAnswer from the files in docs/.<|im_end|>\n<|im_start|>user\n"
                       "What is the color of falcon?<|im_end|>\n<|im_start|>assistant\n")
    out = []
    try:
        for _ in range(n + 1):
            t0 = time.perf_counter()
            asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=32)))
            out.append(time.perf_counter() - t0)
    finally:
        engine.close()
    return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", default="1,32")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(1)
    from rlonce.gateway.http import ServerThread, make_app
    from rlonce.model import loader

    lm = loader.load(loader.resolve("embedded", out / "cache"))
    turn_s = pct(model_turn(lm), 0.5)
    gw, _ = make_gateway(lm)  # the in-process path, as the built-in arms use it (no server, no executor)
    served, _ = make_gateway(lm, ThreadPoolExecutor(4))  # served over HTTP: an executor parses and tokenizes
    results = {}
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ServerThread(make_app(served)) as srv, ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        pool.submit(pow, 2, 2).result()  # start the client process before timing anything
        for c in (int(x) for x in args.concurrency.split(",")):
            lat = {"in-process": [], "http": []}
            wall = {"in-process": 0.0, "http": 0.0}
            for r in range(args.repeats):
                for mode in ("in-process", "http"):
                    if mode == "http":
                        xs, w = pool.submit(http_load, srv.base_url, c, args.turns, f"c{c}r{r}").result()
                    else:
                        xs, w = asyncio.run(run_mode(mode, gw, srv.base_url, c, args.turns, f"c{c}r{r}"))
                    lat[mode] += xs
                    wall[mode] += w
                    gw.sessions.clear()
                    served.sessions.clear()
            eng = asyncio.run(engine_only(gw, 200))
            row = {"sessions": c, "turns": len(lat["http"]), "engine_p50_s": pct(eng, 0.5)}
            for mode in lat:
                row[f"{mode}_p50_s"] = pct(lat[mode], 0.5)
                row[f"{mode}_p95_s"] = pct(lat[mode], 0.95)
                row[f"{mode}_turns_per_s"] = len(lat[mode]) / wall[mode]
            row["http_over_inprocess_p50"] = row["http_p50_s"] / row["in-process_p50_s"]
            row["http_over_inprocess_p95"] = row["http_p95_s"] / row["in-process_p95_s"]
            row["http_over_inprocess_throughput"] = row["http_turns_per_s"] / row["in-process_turns_per_s"]
            row["embedded_model_turn_p50_s"] = turn_s
            row["http_p50_over_model_turn"] = row["http_p50_s"] / turn_s
            results[f"{c} sessions"] = row
            print(json.dumps(row))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from rlonce.telemetry.bench import paired_bars, write_table

    ms = lambda x: f"{1000 * x:.2f}"  # noqa: E731
    table = write_table(out / "results.md", [
        "concurrent sessions", "turns", "in-process p50 / p95 (ms)", "HTTP p50 / p95 (ms)", "HTTP / in-process p50",
        "HTTP / in-process p95", "in-process turns/s", "HTTP turns/s", "engine-only p50 (ms)",
        "HTTP p50 / an embedded-model turn (32 tokens)"], [
        [str(r["sessions"]), str(r["turns"]), f"{ms(r['in-process_p50_s'])} / {ms(r['in-process_p95_s'])}",
         f"{ms(r['http_p50_s'])} / {ms(r['http_p95_s'])}", f"{r['http_over_inprocess_p50']:.2f}",
         f"{r['http_over_inprocess_p95']:.2f}", f"{r['in-process_turns_per_s']:.0f}", f"{r['http_turns_per_s']:.0f}",
         ms(r["engine_p50_s"]), f"{r['http_p50_over_model_turn']:.3f} (turn {ms(r['embedded_model_turn_p50_s'])} ms)"]
        for r in results.values()])
    print(table)
    names = list(results)
    paired_bars(out / "gateway.png", names, {
        "in-process p50": [1000 * results[n]["in-process_p50_s"] for n in names],
        "HTTP p50": [1000 * results[n]["http_p50_s"] for n in names],
        "HTTP p95": [1000 * results[n]["http_p95_s"] for n in names]},
        ylabel="ms per turn", title="gateway latency per turn (scripted model, 8-turn chats)")


if __name__ == "__main__":
    main()
