"""Send representative request bodies through the official ``openai`` and ``anthropic`` SDKs.

Each body is passed to the SDK's own ``create`` method (so the SDK's signature accepts every
field; a field the newest SDK no longer declares goes through ``extra_body`` and is named so
below), pointed at the logging proxy (``tests/compat/proxy.py``), which records what the SDK put
on the wire and what the gateway answered:

    python tests/compat/proxy.py --upstream http://127.0.0.1:8001 --port 8002 --client sdk-openai --out /tmp/o.jsonl
    python tests/compat/proxy.py --upstream http://127.0.0.1:8001 --port 8003 --client sdk-anthropic --out /tmp/a.jsonl
    python tests/compat/make_sdk_corpus.py --openai http://127.0.0.1:8002 --anthropic http://127.0.0.1:8003

Every body gets its own API key (so its own gateway session); retries are off. Only loopback.
"""
from __future__ import annotations

import argparse

import anthropic
import openai

PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
PDF = "JVBERi0xLjAKJSVFT0YK"  # "%PDF-1.0\n%%EOF\n"

BASH_FN = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.", "strict": True,
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"], "additionalProperties": False}}}
CUSTOM_CHAT = {"type": "custom", "custom": {
    "name": "apply_patch", "description": "Apply a patch in the *** Begin Patch format.",
    "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /[\\s\\S]+/"}}}}
CUSTOM_CHAT_TEXT = {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}}

# ---- Chat Completions ------------------------------------------------------------------------
CHAT = [
    # 1. sampling and bookkeeping fields, developer role, stop list
    dict(model="embedded", messages=[
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": "Say hi.", "name": "alice"}],
        stop=["\n\n", "END"], n=1, seed=7, temperature=0.7, top_p=0.9, frequency_penalty=0.1,
        presence_penalty=0.1, logit_bias={"50256": -100}, max_completion_tokens=32, user="user-123",
        metadata={"task": "compat"}, store=False, service_tier="auto", safety_identifier="hash-abc",
        prompt_cache_key="compat-1", verbosity="low"),
    # 2. tools: function + custom tools, a full tool round trip, list content everywhere
    dict(model="embedded", messages=[
        {"role": "system", "content": [{"type": "text", "text": "You can run commands."}]},
        {"role": "user", "content": [{"type": "text", "text": "How many files are here?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}},
            {"id": "call_2", "type": "custom",
             "custom": {"name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a.txt\nb.py"}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "Done!"},
        {"role": "assistant", "content": [{"type": "text", "text": "Two files."}]},
        {"role": "user", "content": "And now delete them."},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I won't delete files."}],
         "refusal": "I won't delete files."},
        {"role": "user", "content": "OK, list them again."}],
        tools=[BASH_FN, CUSTOM_CHAT, CUSTOM_CHAT_TEXT],
        tool_choice={"type": "function", "function": {"name": "bash"}}, parallel_tool_calls=False,
        max_tokens=64),
    # 3. structured output, log-probs, reasoning effort, predicted output, modalities
    dict(model="embedded", messages=[{"role": "user", "content": "Give me a JSON list of two colours."}],
         response_format={"type": "json_schema", "json_schema": {
             "name": "colours", "strict": True, "schema": {
                 "type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"}}},
                 "required": ["colours"], "additionalProperties": False}}},
         logprobs=True, top_logprobs=3, reasoning_effort="low", modalities=["text"],
         prediction={"type": "content", "content": "{\"colours\": [\"red\", \"blue\"]}"},
         max_completion_tokens=48),
    # 4. image content part, streaming with usage, tool_choice "none"
    dict(model="embedded", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"}}]}],
         tools=[BASH_FN], tool_choice="none", stream=True,
         stream_options={"include_usage": True}, max_tokens=32),
    # 5. json_object, a plain stop string, allowed-tools choice, "required"-style tool use
    dict(model="embedded", messages=[
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "List the files as JSON."}],
        response_format={"type": "json_object"}, stop="END",
        tools=[BASH_FN, {"type": "function",
                         "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}],
        tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "bash"}}]}},
        max_tokens=32),
    # 6. the legacy functions / function_call fields and the "function" role
    dict(model="embedded", messages=[
        {"role": "user", "content": "What's the time?"},
        {"role": "assistant", "content": None, "function_call": {"name": "now", "arguments": "{}"}},
        {"role": "function", "name": "now", "content": "12:00"}],
        functions=[{"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}],
        function_call="auto", max_tokens=16),
]

# ---- Anthropic Messages ----------------------------------------------------------------------
BASH_TOOL = {"name": "bash", "description": "Run a shell command.", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "cache_control": {"type": "ephemeral"}}

MESSAGES = [
    # 1. system blocks with cache_control, stop sequences, metadata, service tier, tool choice;
    #    temperature / top_k are gone from the newest SDK's signature: sent through extra_body
    dict(model="embedded", max_tokens=64,
         system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                 {"type": "text", "text": "Use tools when needed."}],
         messages=[{"role": "user", "content": "How many files are here?"}],
         tools=[BASH_TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use": True},
         stop_sequences=["</answer>"], metadata={"user_id": "user-123"}, service_tier="auto",
         extra_body={"temperature": 0.7, "top_k": 40, "top_p": 0.95}),
    # 2. extended thinking, a tool round trip with thinking / redacted thinking kept,
    #    tool_result with is_error and list content
    dict(model="embedded", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
         system="You can run commands.",
         messages=[
             {"role": "user", "content": [{"type": "text", "text": "How many files are here?"}]},
             {"role": "assistant", "content": [
                 {"type": "thinking", "thinking": "I should list them.", "signature": "c2lnbmF0dXJl"},
                 {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
                 {"type": "text", "text": "Let me look."},
                 {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                 {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "ls /nope"}}]},
             {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                     {"type": "text", "text": "a.txt\nb.py"},
                     {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]},
                 {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                  "content": "ls: cannot access '/nope': No such file or directory"},
                 {"type": "text", "text": "Go on."}]}],
         tools=[BASH_TOOL]),
    # 3. adaptive thinking, output_config (effort, JSON format), image and document blocks,
    #    a forced tool
    dict(model="embedded", max_tokens=256, thinking={"type": "adaptive"},
         output_config={"effort": "medium"},
         messages=[{"role": "user", "content": [
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
             {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
             {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a.txt\nb.py"},
              "title": "listing", "context": "ls output", "citations": {"enabled": True}},
             {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
             {"type": "text", "text": "Describe these.", "cache_control": {"type": "ephemeral"}}]}],
         tools=[BASH_TOOL], tool_choice={"type": "tool", "name": "bash"}),
    # 4. structured output through output_config.format, tool_choice none, streaming
    dict(model="embedded", max_tokens=64, stream=True,
         output_config={"format": {"type": "json_schema", "schema": {
             "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
             "additionalProperties": False}}},
         messages=[{"role": "user", "content": "How many files? Answer as JSON."},
                   {"role": "assistant", "content": "{\"n\": "}],
         tools=[BASH_TOOL], tool_choice={"type": "none"}),
    # 5. server tools (web_search, web_fetch) and their result blocks in the history, tool_choice any
    dict(model="embedded", max_tokens=128,
         messages=[
             {"role": "user", "content": "Search for rlonce."},
             {"role": "assistant", "content": [
                 {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "rlonce"}},
                 {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                     {"type": "web_search_result", "url": "https://example.com", "title": "Example",
                      "encrypted_content": "ZW5j", "page_age": "1 day"}]},
                 {"type": "text", "text": "Found one page.", "citations": [
                     {"type": "web_search_result_location", "url": "https://example.com", "title": "Example",
                      "encrypted_index": "ZW5j", "cited_text": "Example"}]}]},
             {"role": "user", "content": "Thanks, now list files."}],
         tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 3,
                 "allowed_domains": ["example.com"]},
                {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 1},
                {"type": "bash_20250124", "name": "bash"},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}],
         tool_choice={"type": "any"}),
]
# beta-only fields: context_management, mcp_servers, container (client.beta.messages.create)
MESSAGES_BETA = [
    dict(model="embedded", max_tokens=128, betas=["context-management-2025-06-27", "mcp-client-2025-04-04"],
         context_management={"edits": [
             {"type": "clear_thinking_20251015", "keep": "all"},
             {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 30000},
              "keep": {"type": "tool_uses", "value": 3}}]},
         mcp_servers=[{"type": "url", "url": "https://mcp.example.com/sse", "name": "example",
                       "authorization_token": "tok"}],
         container="container_abc",
         thinking={"type": "enabled", "budget_tokens": 1024},
         system=[{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
         messages=[{"role": "user", "content": [{"type": "text", "text": "List files."}]}],
         tools=[BASH_TOOL]),
]

# ---- Responses -------------------------------------------------------------------------------
FN = {"type": "function", "name": "bash", "description": "Run a shell command.", "strict": True,
      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                     "required": ["command"], "additionalProperties": False}}
CUSTOM = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
          "format": {"type": "grammar", "syntax": "lark", "definition": "start: /[\\s\\S]+/"}}

RESPONSES = [
    # 1. instructions + string input, reasoning, text format/verbosity, bookkeeping fields
    dict(model="embedded", instructions="You are terse.", input="Say hi.",
         reasoning={"effort": "low", "summary": "auto"},
         text={"format": {"type": "text"}, "verbosity": "low"}, truncation="auto", store=False,
         include=["reasoning.encrypted_content", "message.output_text.logprobs"],
         max_output_tokens=32, metadata={"task": "compat"}, prompt_cache_key="compat-1",
         safety_identifier="hash-abc", service_tier="auto", temperature=0.7, top_p=0.9,
         top_logprobs=2, user="user-123"),
    # 2. a whole agent turn as items: developer message, reasoning, function and custom calls
    #    with outputs (string and list), an assistant output message
    dict(model="embedded", input=[
        {"role": "developer", "content": "You can run commands."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "How many files are here?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "List them."}],
         "encrypted_content": "ZW5jcnlwdGVk"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "bash",
         "arguments": "{\"command\": \"ls\"}", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.py"},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2", "name": "apply_patch",
         "input": "*** Begin Patch\n*** End Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done!"},
        {"type": "function_call", "call_id": "call_3", "name": "bash", "arguments": "{\"command\": \"cat a.txt\"}"},
        {"type": "function_call_output", "call_id": "call_3", "output": [
            {"type": "input_text", "text": "hello"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": "Two files.", "annotations": []}]},
        {"role": "user", "content": "List them again."}],
        tools=[FN, CUSTOM, {"type": "web_search"}],
        tool_choice={"type": "function", "name": "bash"}, parallel_tool_calls=False, max_tool_calls=5,
        max_output_tokens=64, store=False),
    # 3. structured output (json_schema) and streaming, tool_choice "required"
    dict(model="embedded", instructions="Answer in JSON.",
         input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Two colours?"}]}],
         text={"format": {"type": "json_schema", "name": "colours", "strict": True, "schema": {
             "type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"}}},
             "required": ["colours"], "additionalProperties": False}}},
         tools=[FN], tool_choice="required", stream=True, max_output_tokens=48),
    # 4. allowed-tools and custom tool choices, a system-role item, an output refusal, input_file
    dict(model="embedded", input=[
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": [
            {"type": "input_text", "text": "Delete everything."},
            {"type": "input_file", "filename": "notes.txt", "file_data": "data:text/plain;base64,aGVsbG8="}]},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I won't."}]},
        {"role": "user", "content": "Then apply an empty patch."}],
        tools=[FN, CUSTOM],
        tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": "custom", "name": "apply_patch"}]},
        reasoning={"effort": "minimal"}, text={"format": {"type": "json_object"}},
        truncation="disabled", max_output_tokens=32),
    dict(model="embedded", input="Apply an empty patch.", tools=[CUSTOM],
         tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=32),
]


def run(label, fn, body, key):
    try:
        out = fn(**body)
        if body.get("stream"):
            for _ in out:
                pass
            print(f"{label}: ok (stream)")
        else:
            print(f"{label}: ok")
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        print(f"{label}: HTTP {e.status_code}: {str(e)[:300]}")
    except Exception as e:  # a client-side failure (e.g. the SDK could not parse the reply)
        print(f"{label}: {type(e).__name__}: {str(e)[:300]}")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--openai", required=True, help="proxy base URL for the openai SDK (loopback)")
    p.add_argument("--anthropic", required=True, help="proxy base URL for the anthropic SDK (loopback)")
    a = p.parse_args(argv)
    for i, body in enumerate(CHAT, 1):
        c = openai.OpenAI(base_url=a.openai + "/v1", api_key=f"sk-sdk-chat-{i}", max_retries=0)
        run(f"chat {i}", c.chat.completions.create, body, c.api_key)
    for i, body in enumerate(RESPONSES, 1):
        c = openai.OpenAI(base_url=a.openai + "/v1", api_key=f"sk-sdk-responses-{i}", max_retries=0)
        run(f"responses {i}", c.responses.create, body, c.api_key)
    for i, body in enumerate(MESSAGES, 1):
        c = anthropic.Anthropic(base_url=a.anthropic, api_key=f"sk-sdk-messages-{i}", max_retries=0)
        run(f"messages {i}", c.messages.create, body, c.api_key)
    for i, body in enumerate(MESSAGES_BETA, 1):
        c = anthropic.Anthropic(base_url=a.anthropic, api_key=f"sk-sdk-messages-beta-{i}", max_retries=0)
        run(f"messages beta {i}", c.beta.messages.create, body, c.api_key)


if __name__ == "__main__":
    main()
