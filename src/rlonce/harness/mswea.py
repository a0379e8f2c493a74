"""Run mini-swe-agent (PyPI ``mini-swe-agent``) as an outside harness: ``python -m rlonce.harness.mswea``.

The glue ``rlonce eval --harness-cmd`` needs and nothing more: it reads the task and the
gateway address from the environment variables ``run_outside`` sets, runs mini-swe-agent's
own ``DefaultAgent`` (its bash tool, its local environment in the workspace, its submission
rule: a command whose output starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), and
writes the submission to ``$RLONCE_ANSWER_FILE``. The prompts are mini-swe-agent's tool-calling
ones, shortened to fit a small model's context.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

SYSTEM = "You are a helpful assistant that can interact with a computer through the bash tool."
INSTANCE = ("{{task}}\n\nRun one bash command per turn with the bash tool. When done, run "
            "`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo ANSWER` with your answer in place of ANSWER.")


def main() -> int:
    env = os.environ
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-"))
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    try:
        import litellm
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.config import get_config_from_spec
        from minisweagent.environments.local import LocalEnvironment
        from minisweagent.models.litellm_model import LitellmModel
    except ImportError:
        print("rlonce: mini-swe-agent is not installed; pip install mini-swe-agent", file=sys.stderr)
        return 2
    litellm.suppress_debug_info = True
    cfg = get_config_from_spec("mini.yaml")
    model = LitellmModel(model_name="openai/" + env.get("RLONCE_MODEL", "rlonce"),
                         model_kwargs={"api_base": env["OPENAI_BASE_URL"], "api_key": env["OPENAI_API_KEY"],
                                       "drop_params": True},
                         cost_tracking="ignore_errors",
                         observation_template=cfg["model"]["observation_template"],
                         format_error_template=cfg["model"]["format_error_template"])
    agent = DefaultAgent(model, LocalEnvironment(cwd=os.getcwd(), timeout=30),
                         system_template=env.get("RLONCE_MSWEA_SYSTEM", SYSTEM),
                         instance_template=env.get("RLONCE_MSWEA_INSTANCE", INSTANCE),
                         step_limit=int(env.get("RLONCE_STEP_LIMIT", "8")), cost_limit=0,
                         output_path=Path(env["RLONCE_TRAJECTORY"]) if env.get("RLONCE_TRAJECTORY") else None)
    try:
        result = agent.run(env.get("RLONCE_TASK", ""))
    except Exception as e:  # noqa: BLE001 - report and exit non-zero; rlonce decides what it means
        print(f"mini-swe-agent stopped: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"mini-swe-agent: exit_status={result.get('exit_status')} steps={agent.n_calls}", file=sys.stderr)
    if result.get("exit_status") == "Submitted" and env.get("RLONCE_ANSWER_FILE"):
        Path(env["RLONCE_ANSWER_FILE"]).write_text(result.get("submission", "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
