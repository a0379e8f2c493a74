"""Attack probes from inside the outside-harness sandbox (an agent CLI driving a task): it reaches
the gateway and nothing else, and sees none of rlonce beyond the harness glue.

The probes run as the harness command itself; they write what they found to the answer file,
which ``run_outside`` returns as the sequence's answer. Only loopback and the sandbox's own
namespace are probed.
"""

import asyncio
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.toolfind.env import ToolfindEnv
from rlonce.envs.toolfind.tasks import make_task
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import AsyncServer, make_app
from rlonce.gateway.session import GatewaySettings
from rlonce.harness.outside import run_outside
from rlonce.model.chat import get_format

pytestmark = pytest.mark.sandbox

PROBE = r'''
import json, os, socket, subprocess, sys, urllib.request
out = {}
base = os.environ["OPENAI_BASE_URL"]
req = urllib.request.Request(base + "/chat/completions", method="POST",
                             data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                      "Content-Type": "application/json"})
try:
    out["gateway"] = urllib.request.urlopen(req, timeout=20).status
except Exception as e:
    out["gateway"] = repr(e)
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    out["host_service"] = "reached"
except OSError as e:
    out["host_service"] = type(e).__name__
out["interfaces"] = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
out["routes"] = open("/proc/net/route").read().splitlines()[1:]
out["rlonce_files"] = sorted(os.path.relpath(os.path.join(d, f), "/opt/rlonce/src")
                             for d, _, fs in os.walk("/opt/rlonce/src") for f in fs)
try:
    import rlonce.envs.code.env
    out["rlonce_envs"] = "imported"
except ImportError:
    out["rlonce_envs"] = "missing"
found = subprocess.run("find / -xdev -name 'bwrap.py' -path '*rlonce*' 2>/dev/null; "
                       "find /opt /root /usr -name 'hostfs.py' 2>/dev/null", shell=True, capture_output=True, text=True)
out["rlonce_sources"] = found.stdout.split()
open(os.environ["RLONCE_ANSWER_FILE"], "w").write(json.dumps(out))
'''


def test_outside_harness_reaches_the_gateway_and_nothing_else(lm):
    srv_sock = socket.create_server(("127.0.0.1", 0))
    port = srv_sock.getsockname()[1]
    hits = []
    threading.Thread(target=lambda: hits.append(srv_sock.accept()), daemon=True).start()
    fmt = get_format("hermes")
    engine = ScriptedEngine([fmt.assistant_text("hello", [])], lm.encode)
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=fmt,
                                 sampling=SamplingParams(max_tokens=16), offload=ThreadPoolExecutor(4)))
    task = make_task("heldout", 3)

    async def go():
        async with AsyncServer(make_app(gw)) as srv:
            cmd = f"cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF\npython /tmp/probe.py {port}"
            return await run_outside(task, ToolfindEnv, gw, srv.base_url, cmd, name="probe", timeout=60)

    try:
        seq = asyncio.run(go())
    finally:
        srv_sock.close()
    found = json.loads(seq.answer)
    assert found["gateway"] == 200  # the relayed gateway answers
    assert found["host_service"] == "ConnectionRefusedError" and not hits
    assert found["interfaces"] == ["lo"] and found["routes"] == []
    assert found["rlonce_files"] == ["relay.py", "rlonce/__init__.py", "rlonce/harness/__init__.py",
                                     "rlonce/harness/mswea.py"]
    assert found["rlonce_envs"] == "missing" and found["rlonce_sources"] == []
