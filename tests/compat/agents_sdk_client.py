"""The openai-agents run recorded as openai-agents-chat / openai-agents-responses:

    python tests/compat/agents_sdk_client.py chat|responses   # proxy on 127.0.0.1:8002
"""
import asyncio
import os
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)

@function_tool
def list_files(directory: str = ".") -> str:
    """List the files in a directory."""
    return "\n".join(sorted(os.listdir(directory)))

@function_tool
def bash(command: str) -> str:
    """Run a shell command (disabled here)."""
    return "not allowed"

async def one(kind: str, key: str, stream: bool):
    client = AsyncOpenAI(base_url="http://127.0.0.1:8002/v1", api_key=key)
    model_class = OpenAIChatCompletionsModel if kind == "chat" else OpenAIResponsesModel
    model = model_class(model="embedded", openai_client=client)
    agent = Agent(name="lister", instructions="You list files. Use the tools.", model=model,
                  tools=[list_files, bash], model_settings=ModelSettings(temperature=0.2, max_tokens=128))
    prompt = "list the files in this directory and say how many there are"
    try:
        if stream:
            r = Runner.run_streamed(agent, prompt, max_turns=3)
            async for _ in r.stream_events():
                pass
        else:
            r = await Runner.run(agent, prompt, max_turns=3)
        print(f"[{kind} stream={stream}] final:", repr(r.final_output)[:500])
    except Exception as e:
        print(f"[{kind} stream={stream}] {type(e).__name__}: {str(e)[:500]}")

async def main():
    kind = sys.argv[1]
    await one(kind, f"sk-test-agents-{kind}-1", False)
    await one(kind, f"sk-test-agents-{kind}-2", True)

asyncio.run(main())
