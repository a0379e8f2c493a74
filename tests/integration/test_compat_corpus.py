"""The compatibility corpus (``tests/compat/corpus``) replayed against the gateway over HTTP.

Every request body there was sent by a real agent client (Claude Code, Codex, opencode,
qwen-code, llm, the OpenAI Agents SDK) or built from the newest ``openai``/``anthropic`` SDK
types, recorded through ``tests/compat/proxy.py``. Each is replayed on a session of its own to a
served gateway whose context fits it (a scripted model answers), and must get a 200: nothing a
real API accepts may be refused. Streams must end with their protocol's last event.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import ServerThread, make_app
from rlonce.gateway.session import Budgets, GatewaySettings
from rlonce.model.chat import get_format

CORPUS = Path(__file__).resolve().parents[1] / "compat" / "corpus"
FMT = get_format("hermes")
LAST_EVENT = {"/v1/chat/completions": "data: [DONE]", "/v1/messages": "event: message_stop",
              "/v1/responses": "event: response.completed"}


def _requests() -> list:
    out = []
    for f in sorted(CORPUS.glob("*.jsonl")):
        for i, line in enumerate(f.read_text().splitlines()):
            r = json.loads(line)
            out.append(pytest.param(r, id=f"{f.stem}-{i}-{r['method']}{r['path'].split('?')[0].replace('/', '_')}"))
    return out


class Cycling(ScriptedEngine):
    async def generate(self, prompt_ids, sampling, watch=None):
        self._turns.append(self._turns[0])
        return await super().generate(prompt_ids, sampling, watch)


@pytest.fixture(scope="module")
def base(lm):
    turn = FMT.assistant_text("There are three files.", [])
    gw = Gateway(GatewaySettings(engine=Cycling([turn], lm.encode), encode=lm.encode, decode=lm.decode, fmt=FMT,
                                 sampling=SamplingParams(max_tokens=64), budgets=Budgets(64, 1 << 20),
                                 auto_open=True, honor_client_sampling=True, context_errors=True,
                                 offload=ThreadPoolExecutor(2)))
    with ServerThread(make_app(gw)) as srv:
        yield srv.base_url


def test_the_corpus_holds_every_protocol_and_real_clients():
    clients = {json.loads(line)["client"] for f in CORPUS.glob("*.jsonl") for line in f.read_text().splitlines()}
    assert {"claude-code", "codex-responses", "opencode", "qwen-code", "llm", "sdk-openai", "sdk-anthropic"} <= clients


@pytest.mark.parametrize("rec", _requests())
def test_replayed_request_is_accepted(base, rec):
    path = rec["path"] + (f"?{rec['query']}" if rec.get("query") else "")
    key = f"replay-{rec['client']}-{abs(hash(json.dumps(rec['body'], sort_keys=True))) % 10**9}"
    headers = {"authorization": f"Bearer {key}", "x-api-key": key}
    if rec["method"] == "HEAD":
        assert httpx.head(base + path, headers=headers).status_code == 200
        return
    r = httpx.request(rec["method"], base + path, json=rec["body"], headers=headers, timeout=120)
    assert r.status_code == 200, r.text[:400]
    if (rec["body"] or {}).get("stream"):
        assert LAST_EVENT[rec["path"].split("?")[0]] in r.text, r.text[-400:]
