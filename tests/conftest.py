import asyncio
import contextlib
import os
import shutil
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from rlonce.engine.scripted import ScriptedEngine

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def chromium():
    """Skip unless headless Chromium (Debian package chromium) and Playwright can render here."""
    from rlonce.envs.visual.render import BrowserMissing, require_browser

    pytest.importorskip("playwright", reason="Playwright is not installed")
    try:
        require_browser()
    except BrowserMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def embedded_dir(tmp_path_factory):
    from rlonce.model.loader import materialize_embedded

    return materialize_embedded(tmp_path_factory.mktemp("model") / "embedded")


def built_once(tmp_path_factory, name, build):
    """``name``/pack, made by ``build(folder)`` once per test run: under pytest-xdist the workers
    share it (the first to ask builds it under a file lock, the others wait and reuse it)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base folder, above each worker's own
    out, done = root / name / "pack", root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out.parent, ignore_errors=True)
            out.parent.mkdir(parents=True)
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def cyber_pack(tmp_path_factory):
    """A cyber pack of one shipped target (8 tasks), built with clang and validated (2 reruns)."""
    from rlonce.envs.cyber.build import build_pack
    from rlonce.envs.cyber.validate import validate_pack

    def build(out):
        build_pack(out, ["strutil"], progress=False)
        validate_pack(out, reruns=2, progress=False)

    return built_once(tmp_path_factory, "cyber", build)


@pytest.fixture(scope="session")
def code_pack(tmp_path_factory):
    """A code pack of 6 tasks on the shipped test package ``minicalc``, validated (2 reruns). Tests
    that write into a pack (audits, rubrics) work on a copy (``shutil.copytree``)."""
    from pathlib import Path

    from rlonce.envs.code.build import build_pack
    from rlonce.envs.code.packages import PackageSpec
    from rlonce.envs.code.validate import validate_pack

    mini = Path(__file__).resolve().parent / "data" / "minipkg"
    spec = PackageSpec("minicalc", "0.0.0", "", ".", ("minicalc/__init__.py",), ("tests",), local=str(mini),
                       test_timeout=30.0)
    def build(out):
        build_pack(out, [spec], 6, seed=3, progress=False)
        validate_pack(out, reruns=2, progress=False)

    return built_once(tmp_path_factory, "codepack", build)


@pytest.fixture(scope="session")
def lm(embedded_dir):
    import torch

    torch.set_num_threads(1)
    from rlonce.model.loader import load

    return load(embedded_dir)


@pytest.fixture(scope="session")
def script_module():
    """Loads a script that is not a package module (``benchmarks/<name>/run.py``) as a module named
    ``name``, registered in ``sys.modules`` (its dataclasses look their module up there)."""
    import importlib.util
    import sys

    def load(path: Path, name: str):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test starts at one torch thread: a job an earlier test ran in this worker leaves its
    rollout or train thread count (two), and two threads round float sums differently."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def no_internal_errors():
    """A test that makes rlonce record an ``internal_error`` (a bug of ours caught at the rollout
    boundary) fails, even when the run around it carried on. A test that provokes one on
    purpose empties ``rlonce.errors.INTERNAL_ERRORS`` itself."""
    from rlonce.errors import INTERNAL_ERRORS

    INTERNAL_ERRORS.clear()
    yield
    found, INTERNAL_ERRORS[:] = list(INTERNAL_ERRORS), []
    assert not found, f"rlonce recorded internal errors: {found}"


TOOLS = {"bwrap": ("sandbox", "bubblewrap"), "abc2midi": ("abcmidi", "abcmidi"), "clang": ("clang", "clang"),
         "chromium": ("browser", "chromium")}
"""Executable → (the marker of the tests that need it, its Debian package)."""


WHOLE_JOB_FIXTURES = frozenset({"tiny_run", "quickstart_run", "code_pack", "cyber_pack", "table_results", "built",
                                "audited", "reference", "embedded_dir", "lm"})
"""Fixtures that run a whole job or build a pack once for many tests: the test that first asks for one
pays for it within its own time limit, so it gets ``WHOLE_JOB_TIMEOUT`` instead of the suite's 600 s
(on a loaded laptop a whole tiny run took over 600 s). A hang still fails, later."""
WHOLE_JOB_TIMEOUT = 2400


def pytest_collection_modifyitems(config, items):
    from rlonce.engine.forward import OFF_ENV, forced_off

    if forced_off():  # make test-reference: every engine on transformers' forward
        skip = pytest.mark.skip(reason=f"{OFF_ENV}={os.environ[OFF_ENV]}: the engine runs the reference path")
        for item in items:
            if "fast_path" in item.keywords:
                item.add_marker(skip)
    for item in items:
        if WHOLE_JOB_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(WHOLE_JOB_TIMEOUT))
    for tool, (marker, package) in TOOLS.items():
        if shutil.which(tool) is None:
            skip = pytest.mark.skip(reason=f"{tool} is not installed (apt-get install {package})")
            for item in items:
                if marker in item.keywords:
                    item.add_marker(skip)


def gen_many(engine, prompts, sampling):
    """Generate every prompt with its sampling parameters concurrently (one batch for the engine)."""
    async def go():
        return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, sampling)))

    return asyncio.run(go())


def slack(seconds: float) -> float:
    """A wall-clock bound for this machine now: ``seconds`` on an idle machine, stretched by how far
    the run queue exceeds the cores (one-minute load average over CPUs, at least 1, at most 4). A
    test of a time limit stays able to fail when the limit does not fire (a hang runs far past any
    slack), and a laptop busy with a build beside it does not fail it."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 1.0
    return seconds * min(max(load, 1.0), 4.0)


class ToolCaller(ScriptedEngine):
    """The scripted model of the client tests, whose turns are real tool calls. It reads the prompt
    it is given (ChatML with ``<tools>`` and ``<tool_response>`` blocks, as ``hermes`` renders them):
    when the prompt's last turn holds tool results it answers in text quoting the last one
    (``answer(result)``); otherwise it calls the first tool of ``calls`` that the prompt offers,
    with the arguments given there, or says that none is offered. It keeps every prompt it was
    given (``prompts``). Log-probs 0.0, version 0, like the scripted engine."""

    def __init__(self, calls: dict[str, dict], encode, decode, fmt):
        super().__init__([], encode)
        self.calls, self.encode, self.decode, self.fmt = calls, encode, decode, fmt

    @staticmethod
    def answer(result: str) -> str:
        return f"The tool answered: {result[:400]}"

    def offered(self, prompt: str) -> list[str]:
        import json
        import re

        names = []
        for block in re.findall(r"<tools>\n(.*?)\n</tools>", prompt, flags=re.S):
            names += [json.loads(line)["name"] for line in block.splitlines() if line.strip()]
        return names

    def turn(self, prompt: str) -> str:
        import re

        from rlonce.model.chat import ToolCall

        last_user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if last_user.startswith("<tool_response>"):
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", last_user, flags=re.S)
            return self.answer(results[-1]) + self.fmt.turn_end
        offered = self.offered(prompt)
        name = next((n for n in self.calls if n in offered), None)
        if name is None:
            return f"No tool I can call is offered (offered: {', '.join(offered) or 'none'})." + self.fmt.turn_end
        return self.fmt.assistant_text("", [ToolCall(name, self.calls[name])])

    async def generate(self, prompt_ids, sampling, watch=None):
        self._turns.append(self.turn(self.decode(prompt_ids)))  # the scripted engine replays it
        return await super().generate(prompt_ids, sampling, watch)


@pytest.fixture()
def tool_served(lm):
    """``serve(calls)``: the ``ToolCaller`` model behind a gateway with the settings ``rlonce serve``
    gives a model (``GatewaySettings.serving``: sessions opened by key, client sampling honoured,
    the real APIs' context errors), served over HTTP on loopback; returns (gateway, engine, server).
    The context is large enough for agent CLIs' prompts (the scripted model reads any length)."""
    from concurrent.futures import ThreadPoolExecutor

    from rlonce.gateway.core import Gateway
    from rlonce.gateway.http import ServerThread, make_app
    from rlonce.gateway.settings import GatewaySettings
    from rlonce.model.chat import get_format

    started = []

    def serve(calls: dict[str, dict], *, max_tokens: int = 512, max_context: int = 1 << 20):
        fmt = get_format(lm.chat_format)
        engine = ToolCaller(calls, lm.encode, lm.decode, fmt)
        gw = Gateway(GatewaySettings.serving(
            engine=engine, encode=lm.encode, decode=lm.decode, fmt=fmt, model_name="embedded",
            max_tokens=max_tokens, max_context=max_context, tokenizer=lm.tokenizer, offload=ThreadPoolExecutor(4)))
        srv = ServerThread(make_app(gw)).start()
        started.append(srv)
        return gw, engine, srv

    yield serve
    for srv in started:
        srv.stop()


def hub_cache(root: Path, repo_id: str, folder: Path) -> Path:
    """``folder``'s files as the cached main revision of ``repo_id`` under the Hugging Face cache
    ``root``; the snapshot folder. The layout is the one huggingface_hub documents
    (huggingface.co/docs/huggingface_hub/guides/manage-cache: ``models--org--name/{blobs,refs,
    snapshots}``, snapshot files linking to blobs by their sha256): the library has no call that
    writes a cache without the network."""
    import hashlib

    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(folder.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@contextlib.contextmanager
def loopback(handler):
    """A real HTTP server on loopback answering with ``handler`` (a ``BaseHTTPRequestHandler``
    class standing in for an outside endpoint): its base URL while the block runs."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


TIME_KEYS = ("seconds", "wall", "per_s", "rollouts_bytes", "peak_rss")
"""Metric keys that measure time (or sizes that vary with it): they never repeat between runs."""


def untimed(x):
    """``x`` (a run's metrics, ledger or summary) without the values that measure time."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if not any(t in k for t in TIME_KEYS)}
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


def sampled_turns(lm, engine_lm, n: int = 3):
    """``n`` sequences the torch engine sampled from ``engine_lm`` for a chat prompt, at temperature 0.8."""
    from rlonce.core.records import Context, Role, Segment, Sequence
    from rlonce.engine.base import SamplingParams
    from rlonce.engine.factory import EngineSpec

    engine = EngineSpec(backend="torch", model_dir=str(lm.path)).build(lm=engine_lm)
    prompt = lm.encode("<|im_start|>user\nWhere is the key?<|im_end|>\n<|im_start|>assistant\n")
    try:
        gens = [asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=24, temperature=0.8, seed=s)))
                for s in range(n)]
    finally:
        engine.close()
    return [Sequence("t", "single-turn", [Context([Segment(Role.PROMPT, prompt),
                                                   Segment(Role.MODEL, g.token_ids, g.logprobs, g.versions,
                                                           g.finish_reason, temperature=0.8)])],
                     reward=0.0) for g in gens]


def lm_copy(lm):
    """``lm`` with its own copy of the model (the session's ``lm`` is shared: never train it)."""
    import copy
    import dataclasses

    return dataclasses.replace(lm, model=copy.deepcopy(lm.model))
