"""Real agent clients against the real gateway: `rlonce serve --model embedded` as a subprocess on
a free loopback port, and each installed client run once on the prompt of tests/compat/README.md
in a scratch directory of its own (HOME, CODEX_HOME, XDG dirs, the llm config dir: all under
tmp_path, so no user setting or key reaches the client).

The CLI agents (Claude Code, Codex, opencode, qwen-code) send prompts of 15k-50k tokens, far past
the embedded model's 1024-token context: the gateway answers with the real APIs' context-length
error, and each client must show its own message for it. The Python clients (llm, openai-agents
over Chat Completions and Responses) send short prompts and must finish with the model's answer.

The embedded model makes no usable tool call, so each client is also run against the scripted
model whose turns are real tool calls (``ToolCaller`` in tests/conftest.py, served with ``rlonce
serve``'s settings and a context the CLI agents' prompts fit): it calls a read-only tool the client
offers, the client runs it and sends the result, and the model's next turn quotes it. Each such test
asserts the whole round trip: the client finished and showed the quoted result, and in the gateway
one context holds the call and, after it, a turn whose prompt — what the model was given — has the
client's system prompt, the tool's schema, the question, the call and its result.

Clients live in RLONCE_AGENT_CLIENTS (default `.agents` in the repository root), laid out as
`scripts/install_agent_clients.sh` makes it: `node_modules/.bin/{claude,codex,opencode,qwen}` and
`venv/bin/{llm,python}` (the venv with openai-agents). A client that is not there is skipped with
the reason. Slow: `make test-agents` (or `pytest -m slow tests/e2e/test_agent_clients.py`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from rlonce.core.records import Role

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLIENTS = Path(os.environ.get("RLONCE_AGENT_CLIENTS") or REPO / ".agents")
PROMPT = "list the files in this directory and say how many there are"
CLIENT_TIMEOUT = 180  # seconds per client run
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
INSTALL_HINT = "scripts/install_agent_clients.sh installs it (make agents)"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """`rlonce serve --model embedded` on a free loopback port; yields its base URL."""
    out = tmp_path_factory.mktemp("serve")
    cmd = [sys.executable, "-m", "rlonce.cli", "serve", "--model", "embedded", "--host", "127.0.0.1",
           "--port", "0", "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out,
                            start_new_session=True)
    lines: list[str] = []
    found: dict[str, str] = {}
    ready = threading.Event()

    def read():  # keep draining the pipe for the whole run, so the server never blocks on it
        for line in proc.stdout:
            lines.append(line)
            m = re.match(r"rlonce gateway for embedded at (http://127\.0\.0\.1:\d+)", line)
            if m and not found:
                found["url"] = m.group(1)
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        ready.wait(300)
        if "url" not in found:
            pytest.fail(f"rlonce serve did not come up (exit {proc.poll()}):\n{''.join(lines)[-3000:]}")
        yield found["url"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _scratch(tmp_path: Path) -> tuple[Path, Path]:
    """The directory the prompt asks about (a.txt, b.py, sub/) and a HOME of the client's own."""
    work, home = tmp_path / "work", tmp_path / "home"
    (work / "sub").mkdir(parents=True)
    (work / "a.txt").write_text("hello\n")
    (work / "b.py").write_text("print(1)\n")
    home.mkdir()
    return work, home


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no provider keys or base URLs of the caller's, every config dir under home."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "TERM": "dumb", "NO_COLOR": "1", "CI": "1", "TMPDIR": str(home / "tmp"),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_STATE_HOME": str(home / ".local" / "state")}
    (home / "tmp").mkdir(exist_ok=True)
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, str]:
    """Run a client (its own process group, so a timeout also ends what it spawned); return its
    exit code and stdout+stderr without colour codes, also written to ``log``."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        raw, _ = proc.communicate(timeout=CLIENT_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
        log.write_text(raw)
        pytest.fail(f"{cmd[0]} did not finish in {CLIENT_TIMEOUT} s; its output:\n{raw[-3000:]}")
    finally:
        try:  # whatever it left running in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = ANSI.sub("", raw)
    log.write_text(f"$ {' '.join(cmd)}\n{text}\nexit {proc.returncode}\n")
    return proc.returncode, text


def _node_client(name: str) -> Path:
    exe = CLIENTS / "node_modules" / ".bin" / name
    if not exe.exists():
        pytest.skip(f"{name} is not installed ({exe} missing); {INSTALL_HINT}")
    if shutil.which("node") is None:
        pytest.skip(f"{name} needs node on PATH")
    return exe


def _venv_client(name: str, client: str | None = None) -> Path:
    exe = CLIENTS / "venv" / "bin" / name
    if not exe.exists():
        pytest.skip(f"{client or name} is not installed ({exe} missing); {INSTALL_HINT}")
    return exe


def _key(client: str) -> str:
    return f"sk-test-{client}-{uuid.uuid4().hex[:8]}"


def _explain(rc: int, out: str) -> str:
    return f"exit {rc}; client output:\n{out[-4000:]}"


# --- CLI agents: their prompt is over the context; each must show its own context-length message ---

def test_claude_code(request, tmp_path):
    exe = _node_client("claude")
    gateway = request.getfixturevalue("gateway")  # started once a client is there
    work, home = _scratch(tmp_path)
    env = _env(home, ANTHROPIC_BASE_URL=gateway, ANTHROPIC_API_KEY=_key("claude"), ANTHROPIC_MODEL="embedded",
               DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    rc, out = _run([str(exe), "-p", PROMPT], work, env, tmp_path / "client.log")
    # Claude Code's own text for Anthropic's "prompt is too long: N tokens > M maximum" (a 400),
    # e.g. "Prompt is too long · the request is ~48764 tokens (limit 1022) but ..."
    check_failed_showing(rc, out, r"Prompt is too long", "API Error: 400")  # recognised, not shown as a raw API error


def check_failed_showing(rc: int, out: str, shown: str, not_shown: str | None = None) -> None:
    """The client exited with an error and its output shows ``shown`` (a regex), never ``not_shown``."""
    assert rc != 0, _explain(rc, out)
    assert re.search(shown, out), _explain(rc, out)
    assert not_shown is None or not_shown not in out, _explain(rc, out)


def test_codex(request, tmp_path):
    exe = _node_client("codex")
    gateway = request.getfixturevalue("gateway")  # started once a client is there
    work, home = _scratch(tmp_path)
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "embedded"\nmodel_provider = "rlonce"\n\n[model_providers.rlonce]\nname = "rlonce"\n'
        f'base_url = "{gateway}/v1"\nwire_api = "responses"\nenv_key = "RLONCE_KEY"\n')
    env = _env(home, CODEX_HOME=str(codex_home), RLONCE_KEY=_key("codex"))
    rc, out = _run([str(exe), "exec", "--skip-git-repo-check", PROMPT], work, env, tmp_path / "client.log")
    # Codex's own text for a Responses 400 with code context_length_exceeded
    check_failed_showing(rc, out, r"ran out of room in the model's context window")


def test_opencode(request, tmp_path):
    exe = _node_client("opencode")
    gateway = request.getfixturevalue("gateway")  # started once a client is there
    work, home = _scratch(tmp_path)
    cfg = home / ".config" / "opencode"
    cfg.mkdir(parents=True)
    (cfg / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"rlonce": {"npm": "@ai-sdk/openai-compatible", "name": "rlonce",
                                "options": {"baseURL": f"{gateway}/v1", "apiKey": _key("opencode")},
                                "models": {"embedded": {"name": "embedded"}}}},
        "model": "rlonce/embedded", "autoupdate": False, "share": "disabled"}, indent=2))
    env = _env(home, OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
               OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1")
    rc, out = _run([str(exe), "run", PROMPT], work, env, tmp_path / "client.log")
    # opencode takes the Chat Completions 400 (code context_length_exceeded) as a context overflow
    # (it tries to compact, which overflows too) and prints the provider's message after "Error:"
    check_failed_showing(rc, out, r"Error: .*maximum context length is \d+ tokens", "has ended")  # session not ended


def test_qwen_code(request, tmp_path):
    exe = _node_client("qwen")
    gateway = request.getfixturevalue("gateway")  # started once a client is there
    work, home = _scratch(tmp_path)
    (home / ".qwen").mkdir()
    (home / ".qwen" / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "openai"}}, "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False}, "general": {"disableAutoUpdate": True}, "$version": 4}, indent=2))
    env = _env(home, OPENAI_API_KEY=_key("qwen"), OPENAI_BASE_URL=f"{gateway}/v1", OPENAI_MODEL="embedded")
    rc, out = _run([str(exe), "-p", PROMPT], work, env, tmp_path / "client.log")
    # qwen-code shows "[API Error: 400 This model's maximum context length is M tokens. ...]"
    check_failed_showing(rc, out, r"API Error: 400 .*maximum context length is \d+ tokens", "API Error: 409")


# --- Python clients: short prompts, a completed answer ---

def test_llm(request, tmp_path):
    exe = _venv_client("llm")
    gateway = request.getfixturevalue("gateway")  # started once a client is there
    work, home = _scratch(tmp_path)
    user_dir = home / "llm"
    user_dir.mkdir()
    (user_dir / "extra-openai-models.yaml").write_text(
        f'- model_id: rlonce\n  model_name: embedded\n  api_base: "{gateway}/v1"\n'
        "  api_key_name: rlonce\n  supports_tools: true\n")
    env = _env(home, LLM_USER_PATH=str(user_dir))
    rc, out = _run([str(exe), "-m", "rlonce", "--key", _key("llm"), "-o", "temperature", "0", PROMPT], work, env,
                   tmp_path / "client.log")
    assert rc == 0, _explain(rc, out)
    assert out.strip(), _explain(rc, out)  # the model's text (the tiny model: no real tool call)


AGENTS_SCRIPT = '''
import asyncio, os, sys
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                    function_tool, set_tracing_disabled)
from openai import AsyncOpenAI

set_tracing_disabled(True)
kind, base_url, key = sys.argv[1:4]

@function_tool
def list_files(directory: str = ".") -> str:
    """List the files in a directory."""
    return "\\n".join(sorted(os.listdir(directory)))

async def one(stream: bool) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=f"{key}-{int(stream)}", max_retries=0)
    model_class = OpenAIChatCompletionsModel if kind == "chat" else OpenAIResponsesModel
    # greedy, so the run is the same each time: with these settings the embedded model stops on
    # its own within the default cap (with a second tool it runs to max_output_tokens, which the
    # Responses API reports as incomplete and the SDK raises as ModelBehaviorError)
    agent = Agent(name="lister", instructions="You list files. Use the tools.",
                  model=model_class(model="embedded", openai_client=client), tools=[list_files],
                  model_settings=ModelSettings(temperature=0.0))
    prompt = "list the files in this directory and say how many there are"
    if stream:
        r = Runner.run_streamed(agent, prompt, max_turns=3)
        async for _ in r.stream_events():
            pass
    else:
        r = await Runner.run(agent, prompt, max_turns=3)
    print(f"[{kind} stream={stream}] final: {r.final_output!r}", flush=True)
    assert isinstance(r.final_output, str) and r.final_output.strip()

async def main():
    await one(False)
    await one(True)

asyncio.run(main())
'''


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_openai_agents(request, tmp_path, kind):
    python = _venv_client("python", "openai-agents")
    probe = subprocess.run([str(python), "-c", "import agents"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"openai-agents is not installed in {python.parent.parent}; {INSTALL_HINT}")
    gateway = request.getfixturevalue("gateway")
    work, home = _scratch(tmp_path)
    script = tmp_path / "agents_run.py"
    script.write_text(AGENTS_SCRIPT)
    rc, out = _run([str(python), str(script), kind, f"{gateway}/v1", _key(f"agents-{kind}")], work, _env(home),
                   tmp_path / "client.log")
    assert rc == 0, _explain(rc, out)
    for stream in (False, True):
        assert re.search(rf"\[{kind} stream={stream}\] final: '.+'", out), _explain(rc, out)


# --- full round trips: a model whose turns are tool calls (ToolCaller, tests/conftest.py) ---

ANSWERED = "The tool answered:"
"""How the scripted model's turn after a tool result begins (``ToolCaller.answer``)."""


def check_round_trip(gw, engine, decode, key: str, tool: str, result: str) -> None:
    """In the session of ``key``, one context holds a turn calling ``tool`` and, after the call's
    result, a turn quoting it, sampled on the whole conversation: the recorded prompt of that turn is
    one the model was given, and it has a system prompt, ``tool``'s schema among the tools, the
    question, the call, and a tool response holding ``result``."""
    s = gw.sessions[key]
    seen = []
    for ctx in s.contexts:
        ids, turns = [], []
        for seg in ctx.segments:
            if seg.role is Role.MODEL:
                turns.append((list(ids), decode(seg.token_ids)))
            ids += seg.token_ids
        seen.append([text[:60] for _, text in turns])
        for (_, called), (prompt_ids, answered) in zip(turns, turns[1:]):
            if not (answered.startswith(ANSWERED) and f'"name": "{tool}"' in called):
                continue
            prompt = decode(prompt_ids)
            assert prompt_ids in engine.prompts  # the model was given exactly this
            head, _, tail = prompt.partition("</tools>")
            assert head.startswith("<|im_start|>system\n") and f'"name": "{tool}"' in head, prompt[:3000]
            assert PROMPT in tail and "<tool_call>" in tail, tail[:3000]
            response = tail.rsplit("<tool_response>", 1)[-1]
            assert result in response and result in answered, (response[:2000], answered)
            return
    raise AssertionError(f"no context of session {key!r} holds a {tool} call and a turn quoting its result: "
                         f"{seen}; events {s.events}")


def test_claude_code_round_trip(request, tmp_path):
    exe = _node_client("claude")
    serve = request.getfixturevalue("tool_served")
    gw, engine, srv = serve({"Bash": {"command": "ls", "description": "List the files"}})
    work, home = _scratch(tmp_path)
    key = _key("claude")
    env = _env(home, ANTHROPIC_BASE_URL=srv.base_url, ANTHROPIC_API_KEY=key, ANTHROPIC_MODEL="embedded",
               DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    rc, out = _run([str(exe), "-p", PROMPT], work, env, tmp_path / "client.log")
    assert rc == 0 and ANSWERED in out and "b.py" in out, _explain(rc, out)
    check_round_trip(gw, engine, request.getfixturevalue("lm").decode, key, "Bash", "b.py")


def test_codex_round_trip(request, tmp_path):
    exe = _node_client("codex")
    serve = request.getfixturevalue("tool_served")
    gw, engine, srv = serve({"exec_command": {"cmd": "ls"}})
    work, home = _scratch(tmp_path)
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "embedded"\nmodel_provider = "rlonce"\n\n[model_providers.rlonce]\nname = "rlonce"\n'
        f'base_url = "{srv.base_url}/v1"\nwire_api = "responses"\nenv_key = "RLONCE_KEY"\n')
    key = _key("codex")
    env = _env(home, CODEX_HOME=str(codex_home), RLONCE_KEY=key)
    rc, out = _run([str(exe), "exec", "--skip-git-repo-check", PROMPT], work, env, tmp_path / "client.log")
    assert rc == 0 and ANSWERED in out and "b.py" in out, _explain(rc, out)
    check_round_trip(gw, engine, request.getfixturevalue("lm").decode, key, "exec_command", "b.py")


def test_opencode_round_trip(request, tmp_path):
    exe = _node_client("opencode")
    serve = request.getfixturevalue("tool_served")
    gw, engine, srv = serve({"bash": {"command": "ls", "description": "List the files"}})
    work, home = _scratch(tmp_path)
    key = _key("opencode")
    cfg = home / ".config" / "opencode"
    cfg.mkdir(parents=True)
    (cfg / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"rlonce": {"npm": "@ai-sdk/openai-compatible", "name": "rlonce",
                                "options": {"baseURL": f"{srv.base_url}/v1", "apiKey": key},
                                "models": {"embedded": {"name": "embedded"}}}},
        "model": "rlonce/embedded", "autoupdate": False, "share": "disabled"}, indent=2))
    env = _env(home, OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
               OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1")
    rc, out = _run([str(exe), "run", PROMPT], work, env, tmp_path / "client.log")
    assert rc == 0 and ANSWERED in out and "b.py" in out, _explain(rc, out)
    check_round_trip(gw, engine, request.getfixturevalue("lm").decode, key, "bash", "b.py")


def test_qwen_code_round_trip(request, tmp_path):
    exe = _node_client("qwen")
    serve = request.getfixturevalue("tool_served")
    work, home = _scratch(tmp_path)
    gw, engine, srv = serve({"list_directory": {"path": str(work)}})
    (home / ".qwen").mkdir()
    (home / ".qwen" / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "openai"}}, "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False}, "general": {"disableAutoUpdate": True}, "$version": 4}, indent=2))
    key = _key("qwen")
    env = _env(home, OPENAI_API_KEY=key, OPENAI_BASE_URL=f"{srv.base_url}/v1", OPENAI_MODEL="embedded")
    rc, out = _run([str(exe), "-p", PROMPT], work, env, tmp_path / "client.log")
    assert rc == 0 and ANSWERED in out and "b.py" in out, _explain(rc, out)
    check_round_trip(gw, engine, request.getfixturevalue("lm").decode, key, "list_directory", "b.py")


def test_llm_round_trip(request, tmp_path):
    exe = _venv_client("llm")
    serve = request.getfixturevalue("tool_served")
    gw, engine, srv = serve({"list_files": {}})
    work, home = _scratch(tmp_path)
    user_dir = home / "llm"
    user_dir.mkdir()
    (user_dir / "extra-openai-models.yaml").write_text(
        f'- model_id: rlonce\n  model_name: embedded\n  api_base: "{srv.base_url}/v1"\n'
        "  api_key_name: rlonce\n  supports_tools: true\n")
    key = _key("llm")
    functions = REPO / "tests" / "compat" / "llm_functions.py"
    rc, out = _run([str(exe), "-m", "rlonce", "--key", key, "--functions", str(functions), "--chain-limit", "3",
                    "-s", "You list files. Use the tools.", PROMPT], work, _env(home, LLM_USER_PATH=str(user_dir)),
                   tmp_path / "client.log")
    assert rc == 0 and ANSWERED in out and "b.py" in out, _explain(rc, out)
    check_round_trip(gw, engine, request.getfixturevalue("lm").decode, key, "list_files", "b.py")


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_openai_agents_round_trip(request, tmp_path, kind):
    python = _venv_client("python", "openai-agents")
    probe = subprocess.run([str(python), "-c", "import agents"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"openai-agents is not installed in {python.parent.parent}; {INSTALL_HINT}")
    serve = request.getfixturevalue("tool_served")
    gw, engine, srv = serve({"list_files": {"directory": "."}})
    work, home = _scratch(tmp_path)
    script = tmp_path / "agents_run.py"
    script.write_text(AGENTS_SCRIPT)
    key = _key(f"agents-{kind}")
    rc, out = _run([str(python), str(script), kind, f"{srv.base_url}/v1", key], work, _env(home),
                   tmp_path / "client.log")
    assert rc == 0, _explain(rc, out)
    decode = request.getfixturevalue("lm").decode
    for stream in (False, True):
        assert re.search(rf"\[{kind} stream={stream}\] final: '{ANSWERED} .*b\.py", out), _explain(rc, out)
        check_round_trip(gw, engine, decode, f"{key}-{int(stream)}", "list_files", "b.py")

