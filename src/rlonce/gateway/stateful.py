"""Request fields that change what the conversation is: honoured with the real API's meaning, or refused.

A chat request normally carries its whole conversation. Some fields ask the server to supply part
of it (an Anthropic ``thread`` continued by id, a Responses ``previous_response_id``,
``conversation``, ``prompt`` or ``item_reference``), to drop or replace part of it (context edits,
compaction), or to change the tools mid-conversation. A gateway that ignored one would sample a
turn on a context the agent never meant and answer 200: the client sees success and the trainer
trains on the wrong prompt. So every such field is either implemented as the real API implements
it, or refused with the error that API gives for what it does not support — so that a client that
can fall back does (the anthropic SDK's tool runner re-sends the whole conversation without
``thread`` on ``thread_unsupported_request``). ``docs/gateway.md`` lists each field per protocol.

What is implemented: Responses ``previous_response_id`` (``protocols.OpenAIResponses``; ``store:
false`` keeps no response to continue, as the real API). Context edits whose trigger is a prompt
size are honoured while they change nothing — below the trigger the real API sends the
conversation as it came, and so does the gateway — and a prompt that reaches the trigger is
refused (``EditTrigger``, checked by the session once the prompt is encoded). Everything else here
is refused before any session is touched.
"""

from __future__ import annotations

from rlonce.gateway.messages import EditTrigger, Message, ProtocolError

THREAD_UNSUPPORTED = {"error_code": "thread_unsupported_request"}
"""Anthropic's ``error.details`` for a ``thread`` the server cannot hold: the SDK's tool runner (and a
thread made with ``unsupported_request_behavior="continue_unthreaded"``) then sends the turn again with
the whole conversation and no ``thread``."""

CLEAR_TOOL_USES_TRIGGER = 100_000
"""Input tokens at which Anthropic's ``clear_tool_uses_20250919`` edit starts clearing (its documented default)."""
CLEAR_TOOL_USES_KEEP = 3
"""Tool uses that edit keeps (its documented default)."""
COMPACT_TRIGGER = 150_000
"""Input tokens at which Anthropic's ``compact_20260112`` edit compacts (its documented default)."""

REFUSED_ITEMS = {
    "item_reference": "asks the server for a stored item",
    "compaction": "stands in for history another server summarised (its content is encrypted)",
    "compaction_trigger": "asks the server to compact the conversation",
    "additional_tools": "adds tools in the middle of the conversation",
}
"""Responses input items that would have the server supply, replace or re-tool the conversation."""


def _obj(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"'{where}' must be an object", param=where)
    return value


def _count(value, where: str, default: int, kinds: tuple[str, ...]) -> tuple[str, int]:
    """A ``{"type": kind, "value": n}`` threshold (``default`` of the first kind when absent)."""
    if value is None:
        return kinds[0], default
    value = _obj(value, where)
    kind, n = value.get("type"), value.get("value")
    if kind not in kinds or isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ProtocolError(f"'{where}' must be {{\"type\": one of {list(kinds)}, \"value\": a non-negative integer}}",
                            param=where)
    return kind, n


def _tighter(a: EditTrigger | None, b: EditTrigger | None) -> EditTrigger | None:
    return b if a is None or (b is not None and b.tokens < a.tokens) else a


# ---- Anthropic Messages --------------------------------------------------------------------

def anthropic(body: dict, msgs: list[Message]) -> EditTrigger | None:
    """Refuse ``thread`` and ``compaction``; check ``context_management`` against the request's
    messages: an edit that would change them now is refused, one that would once the prompt is
    large enough comes back as the ``EditTrigger`` the session checks."""
    if body.get("thread") is not None:
        raise ProtocolError("server-held threads (`thread`) are not supported by this gateway: send the whole "
                            "conversation without `thread` (the SDK's tool runner does so on this error)",
                            param="thread", details=THREAD_UNSUPPORTED)
    if body.get("compaction") is not None:
        raise ProtocolError("server-side compaction (`compaction`) is not supported by this gateway: compact the "
                            "conversation yourself, or send it whole", param="compaction")
    cm = body.get("context_management")
    if cm is None:
        return None
    edits = _obj(cm, "context_management").get("edits") or []
    if not isinstance(edits, list):
        raise ProtocolError("'context_management.edits' must be an array", param="context_management.edits")
    trigger = None
    for i, edit in enumerate(edits):
        where = f"context_management.edits[{i}]"
        kind = _obj(edit, where).get("type")
        if kind == "clear_thinking_20251015":
            _clear_thinking(edit, msgs, where)
        elif kind == "clear_tool_uses_20250919":
            trigger = _tighter(trigger, _clear_tool_uses(edit, msgs, where))
        elif kind == "compact_20260112":
            _, n = _count(edit.get("trigger"), where + ".trigger", COMPACT_TRIGGER, ("input_tokens",))
            trigger = _tighter(trigger, EditTrigger(n, where, "compact the conversation"))
        else:
            raise ProtocolError(f"{where}.type {kind!r} is not a context edit this gateway knows", param=where)
    return trigger


def _clear_thinking(edit: dict, msgs: list[Message], where: str) -> None:
    """``clear_thinking_20251015`` drops the thinking of all but the last ``keep`` assistant turns
    (default 1): served as sent when no thinking lies outside them, refused otherwise."""
    keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return
    _, n = _count(keep, where + ".keep", 1, ("thinking_turns",))
    turns = [i for i, m in enumerate(msgs) if m.role == "assistant"]
    older = turns[:max(0, len(turns) - n)]
    cleared = sum(1 for i in older if msgs[i].reasoning)
    if cleared:
        raise ProtocolError(f"{where} would clear the thinking of {cleared} earlier assistant turn(s), and this "
                            "gateway applies no context edits (it records the conversation as sent): send keep: "
                            "\"all\", or leave those thinking blocks out yourself", param=where)


def _clear_tool_uses(edit: dict, msgs: list[Message], where: str) -> EditTrigger | None:
    """``clear_tool_uses_20250919`` clears the oldest tool results once the trigger is reached,
    keeping the last ``keep``; with no more clearable tool uses than that it never changes a thing."""
    _, keep = _count(edit.get("keep"), where + ".keep", CLEAR_TOOL_USES_KEEP, ("tool_uses",))
    kind, n = _count(edit.get("trigger"), where + ".trigger", CLEAR_TOOL_USES_TRIGGER, ("input_tokens", "tool_uses"))
    excluded = edit.get("exclude_tools") or []
    if not isinstance(excluded, list):
        raise ProtocolError(f"'{where}.exclude_tools' must be an array of tool names", param=where)
    calls = [c for m in msgs if m.role == "assistant" for c in m.tool_calls]
    if sum(1 for c in calls if c.name not in excluded) <= keep:
        return None
    if kind == "input_tokens":
        return EditTrigger(n, where, "clear old tool results")
    if len(calls) >= n:
        raise ProtocolError(f"{where} would clear old tool results now ({len(calls)} tool uses, trigger {n}), and "
                            "this gateway applies no context edits (it records the conversation as sent): leave "
                            "them out yourself, or raise the trigger", param=where)
    return None


def refuse_block(kind: str, block: dict, where: str) -> None:
    """Raise for an Anthropic content block that would have the server replace the history or the
    tools; a compaction block whose content is null (a failed compaction) passes: the API skips it."""
    if kind == "compaction":
        if block.get("content") is None:
            return
        raise ProtocolError(f"{where} is a compaction block, which stands in for history this gateway never "
                            "summarised: send the conversation it replaces", param=where)
    if kind in ("tool_addition", "tool_removal"):
        raise ProtocolError(f"{where} changes the tools mid-conversation ({kind}), which this gateway does not "
                            "support: send the changed `tools` instead", param=where)


# ---- OpenAI Responses ----------------------------------------------------------------------

def responses(body: dict) -> EditTrigger | None:
    """Refuse ``conversation`` and ``prompt`` (nothing is stored under such ids here); read
    ``context_management`` compaction as an ``EditTrigger`` at its threshold."""
    conversation = body.get("conversation")
    if conversation is not None:
        if body.get("previous_response_id") is not None:
            raise ProtocolError("`previous_response_id` cannot be used together with `conversation`",
                                param="conversation")
        cid = conversation.get("id") if isinstance(conversation, dict) else conversation
        raise ProtocolError(f"Conversation with id {cid!r} not found: this gateway keeps no conversations (it serves "
                            "no /v1/conversations); send the whole conversation in `input`, or chain responses "
                            "with `previous_response_id`", status=404, param="conversation")
    prompt = body.get("prompt")
    if prompt is not None:
        pid = prompt.get("id") if isinstance(prompt, dict) else prompt
        raise ProtocolError(f"Prompt with id {pid!r} not found: this gateway keeps no prompt templates; send the "
                            "instructions and input themselves", status=404, param="prompt")
    entries = body.get("context_management")
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise ProtocolError("'context_management' must be an array", param="context_management")
    trigger = None
    for i, entry in enumerate(entries):
        where = f"context_management[{i}]"
        entry = _obj(entry, where)
        n = entry.get("compact_threshold")
        if entry.get("type") != "compaction":
            raise ProtocolError(f"{where}.type {entry.get('type')!r} is not a context management entry this gateway "
                                "knows", param=where)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ProtocolError(f"{where} needs a `compact_threshold` (a positive integer): this gateway compacts "
                                "nothing, and refuses a prompt that reaches the threshold", param=where)
        trigger = _tighter(trigger, EditTrigger(n, where, "compact the conversation"))
    return trigger


def refuse_item(item: dict, where: str) -> None:
    """Raise for a Responses input item that would have the server supply, replace or re-tool the history."""
    kind = item.get("type")
    if kind is None and "id" in item and "role" not in item:
        kind = "item_reference"  # the API lets an item reference leave out its type
    reason = REFUSED_ITEMS.get(kind)
    if reason is not None:
        raise ProtocolError(f"{where} ({kind}) {reason}, which this gateway does not support: send the items "
                            "themselves", param=where)
