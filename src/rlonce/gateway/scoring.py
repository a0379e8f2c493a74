"""Prompt scoring: the one ``/v1/completions`` request the gateway serves — the log-probs of a prompt
of token ids under the served model, in the shape vLLM's OpenAI server gives them, so that a run
can distil from a model served by ``rlonce serve`` as from vLLM (``rlonce.distill.endpoint``).

    POST /v1/completions {"model": M, "prompt": [token ids], "max_tokens": 0 or 1, "prompt_logprobs": k}
    → choices[0].prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]

Each entry after the first holds the prompt's own token at that position and the k most likely
tokens there (k ≤ ``MAX_ALTERNATIVES``, vLLM's default ``max_logprobs``); ``rank`` is 1 + the
number of tokens more likely. Log-probs are the model's at temperature 1 over the whole vocabulary
(vLLM's prompt log-probs are the raw ones too), −inf written as −9999.0 as vLLM's
``clamp_prompt_logprobs`` does. Nothing is generated: the reply's text is empty and no session is
opened — generation is ``/v1/chat/completions``. Any other completions request is refused (400).

The token's log-prob is the trainer's computation (``rlonce.train.trainer.token_logprobs``' own
path without a loss mask: one forward under the model's autocast, ``token_logprobs_over``) made
here directly, because the same forward's logits also give each token's rank and the alternatives.
At the same weights a row scored here equals ``LocalTeacher``'s (``tests/integration/
test_distill_endpoint.py``).
"""

from __future__ import annotations

import math
import time

from rlonce.gateway.messages import ProtocolError

MAX_ALTERNATIVES = 20
"""The most alternatives a scoring request may ask for per position (``prompt_logprobs``)."""
CHUNK = 512
"""Positions whose ranks and alternatives are taken at once (bounds the vocabulary-wide temporaries)."""

ONLY_SCORING = ("this gateway's /v1/completions only scores prompts (prompt: a list of token ids, prompt_logprobs: "
                "an integer >= 0, max_tokens: 0 or 1); generation is /v1/chat/completions")


def scoring_request(body, *, vocab: int, max_context: int) -> tuple[list[int], int]:
    """The prompt's token ids and the alternatives asked per position, or a ``ProtocolError`` (400)."""
    if not isinstance(body, dict):
        raise ProtocolError(ONLY_SCORING)
    ids, k, max_tokens = body.get("prompt"), body.get("prompt_logprobs"), body.get("max_tokens")
    if (not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
            or not isinstance(k, int) or isinstance(k, bool) or k < 0 or max_tokens not in (0, 1)
            or isinstance(max_tokens, bool) or body.get("stream")):
        raise ProtocolError(ONLY_SCORING)
    if k > MAX_ALTERNATIVES:
        raise ProtocolError(f"prompt_logprobs {k} is over {MAX_ALTERNATIVES}: ask for fewer alternatives",
                            param="prompt_logprobs")
    temperature = body.get("temperature")
    if temperature is not None and temperature != 1:
        raise ProtocolError(f"this gateway scores prompts at temperature 1, not {temperature!r}: send 1.0 or none",
                            param="temperature")
    if len(ids) > max_context:
        raise ProtocolError(f"prompt of {len(ids)} tokens is over this server's context of {max_context} tokens "
                            "(--max-context)", param="prompt", code="context_length_exceeded")
    if not all(0 <= t < vocab for t in ids):
        bad = next(t for t in ids if not 0 <= t < vocab)
        raise ProtocolError(f"token id {bad} is not in the model's vocabulary of {vocab}", param="prompt")
    return ids, k


def vocabulary(model) -> int:
    """The number of token ids ``model`` embeds."""
    return model.get_input_embeddings().num_embeddings


def prompt_logprobs(model, ids: list[int], k: int, decode) -> list[dict | None]:
    """vLLM's ``prompt_logprobs`` of ``ids`` under ``model`` (see the module's docstring)."""
    import torch

    from rlonce.model.logits import token_logprobs_over
    from rlonce.model.precision import autocast

    out: list[dict | None] = [None]
    if len(ids) < 2:
        return out
    dev = next(model.parameters()).device
    ids_1T = torch.tensor([ids], device=dev)
    with torch.no_grad(), autocast(model):
        logits_TV = model(input_ids=ids_1T, attention_mask=torch.ones_like(ids_1T)).logits[0, :-1].float()
        next_T = ids_1T[0, 1:]
        lp_T, _ = token_logprobs_over(logits_TV, next_T)
        for at in range(0, len(next_T), CHUNK):
            part_CV = logits_TV[at: at + CHUNK]
            own_C = part_CV.gather(-1, next_T[at: at + CHUNK, None])
            rank_C = (part_CV > own_C).sum(-1) + 1
            top_lp_CK, top_id_CK = part_CV.log_softmax(-1).topk(k, dim=-1) if k else (None, None)
            for c, (token, lp, rank) in enumerate(zip(next_T[at: at + CHUNK].tolist(),
                                                      lp_T[at: at + CHUNK].tolist(), rank_C.tolist())):
                entry = {} if top_id_CK is None else {
                    str(t): _logprob(x, r + 1, decode([t]))
                    for r, (t, x) in enumerate(zip(top_id_CK[c].tolist(), top_lp_CK[c].tolist()))}
                entry[str(token)] = _logprob(lp, rank, decode([token]))
                out.append(entry)
    return out


def _logprob(lp: float, rank: int, text: str) -> dict:
    if math.isnan(lp):
        raise ArithmeticError("the model's log-probs are not numbers (NaN)")
    return {"logprob": max(lp, -9999.0), "rank": rank, "decoded_token": text}


def completion_reply(ids: list[int], entries: list[dict | None], model_name: str) -> dict:
    """The completions reply vLLM gives a scoring request (nothing generated: the text is empty)."""
    return {"id": f"cmpl-{time.time_ns():x}", "object": "text_completion", "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                         "prompt_logprobs": entries, "prompt_token_ids": ids}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}}
