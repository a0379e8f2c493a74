"""Time to first token: the gateway's first SSE event versus the engine's own first token.

    python benchmarks/streaming/run.py --out DIR [--model embedded|smollm2|FOLDER] [--repeats 20] [--max-tokens 48]

A model behind the torch engine (one torch thread; the embedded model by default). Three measurements alternate in
each repeat, on the same prompt and seed: the engine alone (``generate`` with a watch that
stamps the first token), a streamed Chat Completions request over HTTP on loopback (the time
until the first SSE event, which the gateway sends once the first token is sampled, and until
the first delta that carries sampled text), and the same request not streamed (the first byte
comes with the whole turn). The HTTP client runs in its own process, as an agent does: in the
server's process it would compete with the event loop and the engine thread for the GIL. The
medians, their ratios and every sample go to ``results.json``, ``results.md`` and
``streaming.png``. The target: SSE first token within 1.5× the engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

PROMPT = [{"role": "system", "content": "You answer briefly."},
          {"role": "user", "content": "Say what the largest planet is, and why it is so large."}]


def engine_first(engine, prompt_ids, sampling) -> tuple[float, float]:
    """Seconds to the engine's first token and to its last."""
    stamps: list[float] = []

    async def go():
        t0 = time.perf_counter()
        await engine.generate(prompt_ids, sampling, watch=lambda t: stamps.append(time.perf_counter()) and False)
        return t0, time.perf_counter()

    t0, t1 = asyncio.run(go())
    return stamps[0] - t0, t1 - t0


_CLIENT = None


def _carries_text(line: str) -> bool:
    """Whether an SSE line is a Chat Completions chunk with sampled text or a tool call in it."""
    if not line.startswith("data: {"):
        return False
    delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


def http_first(url: str, key: str, stream: bool, max_tokens: int) -> tuple[float, float | None, float]:
    """Seconds to the first SSE event, to the first delta with sampled text (None if none) and to
    the end. Runs in the client process, which keeps one connection open across calls."""
    global _CLIENT
    import httpx

    if _CLIENT is None:
        _CLIENT = httpx.Client(timeout=60)
    body = {"model": "m", "messages": PROMPT, "max_tokens": max_tokens, "stream": stream, "temperature": 1.0}
    t0 = time.perf_counter()
    first = content = None
    with _CLIENT.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
        for line in r.iter_lines():
            now = time.perf_counter()
            if first is None and line:
                first = now - t0
            if content is None and stream and _carries_text(line):
                content = now - t0
    return first, content, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--model", default="embedded", help="embedded, smollm2 or a model folder")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(1)
    from rlonce.engine.base import SamplingParams
    from rlonce.engine.torch_engine import TorchEngine
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.http import ServerThread, make_app
    from rlonce.gateway.messages import Message
    from rlonce.gateway.session import Budgets, GatewaySettings
    from rlonce.model import loader
    from rlonce.model.chat import get_format

    lm = loader.load(loader.resolve(args.model, out / "cache"))
    fmt = get_format(lm.chat_format)
    pad = lm.tokenizer.pad_token_id
    engine = TorchEngine(lm.model, eos_token_ids=lm.eos_token_ids, pad_token_id=pad if pad is not None else 0,
                         batch_wait_s=0.0)
    sampling = SamplingParams(max_tokens=args.max_tokens, seed=7)
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=fmt, sampling=sampling,
                                 budgets=Budgets(args.max_tokens, 1024), auto_open=True, honor_client_sampling=True,
                                 context_errors=True, offload=ThreadPoolExecutor(2)))
    prompt_ids = lm.encode(fmt.render([Message(m["role"], m["content"]) for m in PROMPT], []))
    rows = {"engine_first": [], "engine_total": [], "sse_first": [], "sse_content": [], "sse_total": [],
            "plain_first": []}
    spawn = multiprocessing.get_context("spawn")
    with ServerThread(make_app(gw)) as srv, ProcessPoolExecutor(1, mp_context=spawn) as client:
        url = srv.base_url + "/v1/chat/completions"

        def http(key: str, stream: bool):
            return client.submit(http_first, url, key, stream, args.max_tokens).result()

        for i in range(2):  # warm-up
            engine_first(engine, prompt_ids, sampling)
            http(f"warm-{i}", True)
        for i in range(args.repeats):
            ef, et = engine_first(engine, prompt_ids, sampling)
            sf, sc, st = http(f"s-{i}", True)
            pf, _, _ = http(f"p-{i}", False)
            rows["engine_first"].append(ef)
            rows["engine_total"].append(et)
            rows["sse_first"].append(sf)
            rows["sse_total"].append(st)
            rows["plain_first"].append(pf)
            if sc is not None:
                rows["sse_content"].append(sc)
            print(f"{i + 1}/{args.repeats}: engine {ef * 1e3:.1f} ms, SSE {sf * 1e3:.1f} ms, "
                  f"not streamed {pf * 1e3:.1f} ms", flush=True)
    engine.close()
    med = {k: statistics.median(v) if v else None for k, v in rows.items()}
    results = {"model": args.model, "repeats": args.repeats, "max_tokens": args.max_tokens, "median_s": med,
               "sse_first_over_engine_first": med["sse_first"] / med["engine_first"],
               "plain_first_over_engine_first": med["plain_first"] / med["engine_first"],
               "target": "sse_first_over_engine_first <= 1.5", "samples_s": rows}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    def ms(x):
        return "—" if x is None else f"{x * 1e3:.1f}"

    table = ["| measurement | median (ms) | / engine first token |", "|---|---|---|",
             f"| engine: first token | {ms(med['engine_first'])} | 1.00 |",
             f"| gateway SSE over HTTP: first event | {ms(med['sse_first'])} | "
             f"{results['sse_first_over_engine_first']:.2f} |",
             f"| gateway SSE over HTTP: first delta with sampled text | {ms(med['sse_content'])} | "
             + ("—" if med["sse_content"] is None else f"{med['sse_content'] / med['engine_first']:.2f}") + " |",
             f"| not streamed: first byte (whole turn) | {ms(med['plain_first'])} | "
             f"{results['plain_first_over_engine_first']:.2f} |",
             f"| engine: whole turn | {ms(med['engine_total'])} | {med['engine_total'] / med['engine_first']:.2f} |"]
    (out / "results.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    keys = ["engine_first", "sse_first", "sse_content", "plain_first"]
    names = ["engine\nfirst token", "SSE\nfirst event", "SSE first\ntext delta", "not streamed\nfirst byte"]
    ax.boxplot([[x * 1e3 for x in rows[k]] or [0] for k in keys], tick_labels=names)
    ax.set_ylabel("ms")
    ax.set_title(f"Time to first token: {args.model}, one torch thread")
    fig.tight_layout()
    fig.savefig(out / "streaming.png", dpi=120)


if __name__ == "__main__":
    main()
