"""Fuzzing the gateway's HTTP API from its own OpenAPI document (schemathesis): no request may
get a 5xx, and no session may be left in a state that breaks its invariants."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlonce.core.records import Role
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import make_app
from rlonce.gateway.session import GatewaySettings
from rlonce.model.chat import ToolCall, get_format

FMT = get_format("hermes")


class Cycling(ScriptedEngine):
    """A scripted model that never runs out of turns."""

    async def generate(self, prompt_ids, sampling, watch=None):
        self._turns.append(self._turns[0])
        return await super().generate(prompt_ids, sampling, watch)


@pytest.fixture(scope="module")
def gateway(lm):
    turns = [FMT.assistant_text("ok", [ToolCall("bash", {"command": "ls"})]), "<tool_call>{bad</tool_call><|im_end|>",
             FMT.assistant_text("done", [])]
    shared = GatewaySettings(engine=Cycling(turns, lm.encode), encode=lm.encode, decode=lm.decode, fmt=FMT,
                             sampling=SamplingParams(max_tokens=32), auto_open=True, offload=ThreadPoolExecutor(4))
    return Gateway(shared)


def _operations(gateway):
    schema = schemathesis.openapi.from_asgi("/openapi.json", make_app(gateway, max_body_bytes=1 << 16))
    return [r.ok() for r in schema.get_all_operations()]


def _check(gateway):
    for s in gateway.sessions.values():
        for b in s.branches:
            assert len(b.messages) == len(b.marks) and b.marks == sorted(b.marks)
            assert b.marks[-1] == len(b.context.segments) and b.context.segments[-1].role is Role.MODEL
        s.export()


def test_no_request_gets_a_server_error(gateway):
    ops = _operations(gateway)
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses"} <= {o.path for o in ops}
    seen = []

    @given(data=st.data())
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def fuzz(data):
        op = data.draw(st.sampled_from(ops))
        case = data.draw(op.as_strategy())
        response = case.call(headers={"authorization": "Bearer fuzz"})
        seen.append(response.status_code)
        assert response.status_code < 500, (case.method, case.path, response.text[:300])
        _check(gateway)

    fuzz()
    assert len(seen) >= 60 and any(c == 200 for c in seen) and any(400 <= c < 500 for c in seen)
