"""An endpoint teacher against ``rlonce serve``'s app on loopback: the log-probs it gets back for the
student's tokens are ``LocalTeacher``'s on the same weights, the reply has vLLM's prompt_logprobs
shape (checked against the embedded model's own distribution, computed here), and every other
completions request is refused in one line."""

import asyncio
import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
import torch

from rlonce.core.records import Context, Role, Segment, Sequence
from rlonce.distill.endpoint import EndpointTeacher
from rlonce.distill.teachers import LocalTeacher, scoring_rows
from rlonce.engine.torch_engine import TorchEngine
from rlonce.gateway.core import Gateway
from rlonce.gateway.http import ServerThread, make_app
from rlonce.gateway.session import GatewaySettings
from rlonce.model.chat import get_format

MAX_CONTEXT = 256


@pytest.fixture(scope="module")
def served(lm):
    """``rlonce serve``'s gateway over the embedded model (as ``rlonce.cli.commands._serve`` builds it)."""
    engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0)
    gw = Gateway(GatewaySettings.serving(engine=engine, encode=lm.encode, decode=lm.decode,
                                         fmt=get_format(lm.chat_format), model_name="embedded", max_tokens=32,
                                         max_context=MAX_CONTEXT, offload=ThreadPoolExecutor(2)))
    try:
        with ServerThread(make_app(gw)) as srv:
            yield srv.base_url
    finally:
        engine.close()


def _seqs(lm) -> list[Sequence]:
    """Three sequences of the student's: two contexts (one of two model turns around an observation,
    where the mask is 0), one with a prefix turn that is forced (never trained nor scored)."""
    def model(text):
        ids = lm.encode(text)
        return Segment(Role.MODEL, ids, [-1.0] * len(ids), [0] * len(ids), "stop", temperature=1.0)

    prompt = Segment(Role.PROMPT, lm.encode("<|im_start|>user\nWhere is the key?<|im_end|>\n<|im_start|>assistant\n"))
    obs = Segment(Role.OBSERVATION,
                  lm.encode("<|im_end|>\n<|im_start|>tool\nkey.txt\n<|im_end|>\n<|im_start|>assistant\n"))
    forced = dataclasses.replace(model("ls -la"), forced=True)
    return [Sequence("t", "single-turn", [Context([prompt, model("I will look in the drawer."), obs,
                                                   model("It is in key.txt<|im_end|>")])], reward=1.0),
            Sequence("t", "single-turn", [Context([prompt, forced, obs, model("cat key.txt<|im_end|>")]),
                                          Context([prompt, model("Found it.<|im_end|>")])], reward=0.0),
            Sequence("t", "single-turn", [Context([prompt, model("No idea<|im_end|>")])], reward=0.0)]


def test_endpoint_teacher_scores_the_students_tokens_as_the_local_teacher_does(lm, served):
    by_endpoint, by_weights = _seqs(lm), _seqs(lm)
    teacher = EndpointTeacher(served + "/v1", "embedded", timeout=30, concurrency=2)
    asyncio.run(teacher.score(by_endpoint))
    local = LocalTeacher("same", lm.path, batch_tokens=8192,
                         lm=dataclasses.replace(lm, model=copy.deepcopy(lm.model)))
    asyncio.run(local.score(by_weights))
    pairs = [(a, b) for x, y in zip(by_endpoint, by_weights) for c, d in zip(x.contexts, y.contexts)
             for a, b in zip(c.segments, d.segments)]
    scored = [(a, b) for a, b in pairs if a.trainable]
    assert len(scored) == 5
    for a, b in scored:
        assert len(a.teacher_logprobs) == len(a.token_ids)
        assert a.teacher_logprobs == pytest.approx(b.teacher_logprobs, abs=1e-5)
        assert all(x <= 0 for x in a.teacher_logprobs)
    assert all(a.teacher_logprobs is None for a, _ in pairs if not a.trainable)  # the forced turn, prompts
    # per row: 0.0 exactly wherever the loss mask is 0 (prompt, observation, the forced turn)
    rows, _ = scoring_rows(_seqs(lm))
    for row, (lps, top) in zip(rows, asyncio.run(teacher.score_rows(rows)), strict=True):
        assert top is None  # no distill.topk
        assert len(lps) == len(row) and all(x == 0.0 for x, m in zip(lps, row.loss_mask) if not m)
        assert all(x <= 0 for x, m in zip(lps, row.loss_mask) if m)


def test_the_reply_is_vllms_prompt_logprobs_with_the_models_alternatives(lm, served):
    ids = lm.encode("def f(x):\n    return x + 1")
    r = httpx.post(f"{served}/v1/completions", headers={"authorization": "Bearer t"},
                   json={"model": "embedded", "prompt": ids, "max_tokens": 1, "temperature": 1.0,
                         "prompt_logprobs": 3})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "" and choice["prompt_token_ids"] == ids and r.json()["usage"]["prompt_tokens"] == len(ids)
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    with torch.no_grad():
        ref_TV = lm.model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    for t, entry in enumerate(entries[1:]):
        own = ids[t + 1]
        top_v, top_i = ref_TV[t].topk(3)
        assert set(entry) == {str(i) for i in [*top_i.tolist(), own]}  # the 3 most likely and the prompt's own
        assert entry[str(own)]["logprob"] == pytest.approx(ref_TV[t, own].item(), abs=1e-5)
        assert entry[str(own)]["rank"] == 1 + int((ref_TV[t] > ref_TV[t, own]).sum())
        assert entry[str(own)]["decoded_token"] == lm.decode([own])
        for rank, (i, v) in enumerate(zip(top_i.tolist(), top_v.tolist()), 1):
            assert entry[str(i)]["logprob"] == pytest.approx(v, abs=1e-5) and entry[str(i)]["rank"] == rank


def test_every_other_completions_request_is_refused_in_one_line(lm, served):
    ids = lm.encode("hello there")
    ok = {"model": "m", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    generation = "only scores prompts"
    for body, says in [({**ok, "prompt": "hello there"}, generation), ({**ok, "max_tokens": 16}, generation),
                       ({k: v for k, v in ok.items() if k != "prompt_logprobs"}, generation),
                       ({k: v for k, v in ok.items() if k != "max_tokens"}, generation),
                       ({**ok, "prompt_logprobs": -1}, generation), ({**ok, "stream": True}, generation),
                       ({**ok, "prompt": [True, 2]}, generation), ([1, 2], generation),
                       ({**ok, "prompt_logprobs": 21}, "over 20"), ({**ok, "temperature": 0.7}, "temperature 1"),
                       ({**ok, "prompt": [1] * (MAX_CONTEXT + 1)}, "--max-context"),
                       ({**ok, "prompt": [1, 10**9]}, "not in the model's vocabulary")]:
        r = httpx.post(f"{served}/v1/completions", headers={"authorization": "Bearer t"}, json=body)
        msg = r.json()["error"]["message"]
        assert r.status_code == 400 and says in msg and "\n" not in msg, (body, r.text)
    assert "generation is /v1/chat/completions" in httpx.post(
        f"{served}/v1/completions", headers={"authorization": "Bearer t"}, json={**ok, "max_tokens": 2}).text
    assert httpx.post(f"{served}/v1/completions", json=ok).status_code == 401  # a key, as every protocol route


def test_a_run_builds_an_endpoint_teacher_that_only_scores(lm, tmp_path):
    from rlonce.config import ConfigError, load_config
    from rlonce.distill.executor import Distillation, DistillExecutor
    from rlonce.rollout.builders import rollout_spec
    from rlonce.rollout.sources import build_sources, check_sources

    url = "http://127.0.0.1:9/v1"
    cfg = load_config(None, [f"distill.teacher={url}", "distill.teacher_model=big", "distill.teacher_timeout_s=5",
                             "distill.teacher_concurrency=3"])
    sources = build_sources(check_sources(cfg), rollout_spec(cfg, lm))
    said = []
    distill = Distillation.build(cfg, sources, lm, tmp_path, say=said.append)
    (label,) = sources
    teacher = distill.teacher(label)
    assert isinstance(teacher, EndpointTeacher) and not hasattr(teacher, "lm")  # nothing loaded
    assert (teacher.base_url, teacher.model, teacher.timeout, teacher.concurrency) == (url, "big", 5.0, 3)
    assert said == [f"teacher {url} for {label}: an endpoint (its tokenizer cannot be checked; it must be the "
                    "student's)", f"teacher endpoint {url} did not answer a scoring request before the run "
                    "(ConnectError); its groups are infrastructure failures until it does"]
    assert isinstance(distill.wrap(label, object()), DistillExecutor)
    with pytest.raises(ConfigError, match="is an endpoint: it scores the student's tokens but samples nothing"):
        distill.engine_for(label)
    # under Ray (a backend with teacher actors, here none): the pools score; the driver only keeps the plan
    ray_side = Distillation.build(cfg, sources, lm, tmp_path, backend=SimpleNamespace(teacher_engines={}))
    executor = object()
    assert ray_side.remote and ray_side.of_source == {label: url} and ray_side.wrap(label, executor) is executor


def test_under_ray_an_endpoint_teacher_has_no_actor_and_the_pools_ask_it_directly(lm, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed")
    from rlonce.config import load_config
    from rlonce.dist.teachers import PoolDistillation, start_teachers
    from rlonce.distill.executor import DistillExecutor
    from rlonce.rollout.builders import rollout_spec
    from rlonce.rollout.sources import build_sources, check_sources

    url = "http://127.0.0.1:9/v1"
    cfg = load_config(None, [f"distill.teacher={url}", "executor=ray", "distill.teacher_concurrency=2"])
    (label,) = (p.label for p in check_sources(cfg))
    assert start_teachers(cfg, tmp_path, "run") == ([], {label: url})  # no actor started (nor Ray)
    pools = PoolDistillation(cfg, build_sources(check_sources(cfg), rollout_spec(cfg, lm)), {label: url}, 30.0)
    wrapped = pools.wrap({label: object()})[label]
    assert isinstance(wrapped, DistillExecutor) and isinstance(wrapped.teacher, EndpointTeacher)
    assert (wrapped.teacher.base_url, wrapped.teacher.concurrency) == (url, 2)


def test_an_endpoint_teachers_key_comes_from_the_environment_and_a_missing_one_is_one_line(monkeypatch):
    from rlonce.config import ConfigError, load_config

    d = load_config(None, ["distill.teacher=http://127.0.0.1:9/v1",
                           "distill.teacher_api_key_env=RLONCE_TEST_KEY"]).distill
    monkeypatch.delenv("RLONCE_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="RLONCE_TEST_KEY, which is not set"):
        EndpointTeacher.from_config(d, d.teacher)
    monkeypatch.setenv("RLONCE_TEST_KEY", "sekret")
    assert EndpointTeacher.from_config(d, d.teacher).api_key == "sekret"


def test_an_endpoint_that_refuses_the_runs_top_k_is_refused_before_the_run_in_one_line(lm, served, tmp_path):
    """``rlonce serve`` (as vLLM without --max-logprobs) serves at most 20 alternatives: a run asking
    for 21 is a one-line ConfigError when it builds, not a run whose every group fails; 20 is fine."""
    from rlonce.config import ConfigError, load_config
    from rlonce.distill.executor import Distillation
    from rlonce.rollout.builders import rollout_spec
    from rlonce.rollout.sources import build_sources, check_sources

    def build(*over):
        cfg = load_config(None, [f"distill.teacher={served}/v1", "distill.teacher_model=embedded", *over])
        said = []
        return Distillation.build(cfg, build_sources(check_sources(cfg), rollout_spec(cfg, lm)), lm, tmp_path,
                                  say=said.append), said

    with pytest.raises(ConfigError) as e:
        build("distill.topk=21")
    msg = str(e.value)
    assert "\n" not in msg and "HTTP 400" in msg and "over 20" in msg and "--max-logprobs 21" in msg, msg
    distill, said = build("distill.topk=20")
    assert len(said) == 1 and isinstance(next(iter(distill.teachers.values())), EndpointTeacher)  # answered
