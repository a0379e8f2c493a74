"""Judges from the ``[grading]`` config."""

from __future__ import annotations

from pathlib import Path

from rlonce.config.grading import JudgeConfig
from rlonce.grading.judge import EndpointJudge, Judge, ScriptedJudge
from rlonce.grading.scripted import scripted_rules


def build_judge(cfg: JudgeConfig, record: Path | None, *, name: str = "judge") -> Judge | None:
    """The judge ``cfg`` describes, recording every call to ``record`` (None: ``kind = 'none'``).
    With ``cfg.agentic``, an ``AgenticJudge`` over it: questions that name a workspace are worked
    on as an agent, the others asked directly."""
    common = {"retries": cfg.retries, "timeout": cfg.timeout_s, "concurrency": cfg.concurrency, "record": record,
              "name": name}
    if cfg.kind == "none":
        return None
    if cfg.kind == "scripted":
        judge: Judge = ScriptedJudge(scripted_rules, model="scripted", **common)
    else:
        judge = EndpointJudge(cfg.base_url, cfg.model, protocol=cfg.protocol, api_key_env=cfg.api_key_env,
                              max_tokens=cfg.max_tokens, temperature=cfg.temperature, **common)
    if cfg.agentic:
        from rlonce.grading.agentic import AgenticJudge

        judge = AgenticJudge(judge, max_turns=cfg.agent_turns)
    return judge
