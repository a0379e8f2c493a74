"""Where re-rendering a conversation would differ from the tokens that were sampled.

Frameworks that rebuild the training sequence by running the finished conversation through
the chat template and tokenizing the text get different tokens wherever the model sampled a
non-canonical tokenization, wherever the template normalises what the model wrote (tool-call
JSON re-serialised, whitespace stripped), and wherever it drops earlier content. The gateway
trains on the recorded tokens, so none of that reaches the loss; this report shows, per
context, what a re-render would have changed.
"""

from __future__ import annotations

from rlonce.core.records import Role


def _chat_dicts(messages) -> list[dict]:
    out = []
    for m in messages:
        d: dict = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in m.tool_calls]
        out.append(d)
    return out


def rerender_report(session, tokenizer) -> list[dict]:
    """Per context: recorded tokens vs the chat template's render of its messages, tokenized whole.

    ``first_divergence`` is the first token index where they differ (``None``: identical);
    ``model_tokens_changed`` counts recorded model tokens at or after it — tokens a re-render
    would have trained on that the policy never sampled in that form.
    """
    reports = []
    for b in session.branches:
        recorded = b.context.token_ids()
        text = tokenizer.apply_chat_template(_chat_dicts(b.messages), tools=b.tools or None, tokenize=False)
        if b.messages and b.messages[-1].role == "assistant" and text.endswith("\n"):
            text = text[:-1]  # the recorded context ends at the turn-end token, before the template's newline
        rerendered = tokenizer.encode(text, add_special_tokens=False)
        n = min(len(recorded), len(rerendered))
        first = next((i for i in range(n) if recorded[i] != rerendered[i]), None)
        if first is None and len(recorded) != len(rerendered):
            first = n
        changed, pos = 0, 0
        for seg in b.context.segments:
            end = pos + len(seg.token_ids)
            if seg.role is Role.MODEL and first is not None and end > first:
                changed += end - max(pos, first)
            pos = end
        reports.append({
            "context": b.context.label,
            "recorded_tokens": len(recorded),
            "rerendered_tokens": len(rerendered),
            "first_divergence": first,
            "model_tokens_changed": changed,
            "recorded_text": tokenizer.decode(recorded[first:first + 40]) if first is not None else "",
            "rerendered_text": tokenizer.decode(rerendered[first:first + 40]) if first is not None else "",
        })
    return reports
