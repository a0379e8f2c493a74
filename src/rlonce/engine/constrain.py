"""Constrained decoding: a reply that must match a JSON schema, a regular expression, one of some
strings, or a grammar (a tool call of given tools), enforced as a token mask per row while the
batch decodes.

The grammars are llguidance's (the Low-level Guidance library: vLLM's ``guidance`` structured-output
backend, also used by SGLang). Chosen over xgrammar, the other library vLLM uses, because its wheel
is all it needs (xgrammar's brings Triton and a TVM runtime onto a CPU machine), and because it
computes each mask lazily from the grammar as the reply grows, with no compile step per schema — a
gateway meets a new schema in nearly every request. Both take JSON schemas, regular expressions
and Lark grammars.

``Constraint`` (``rlonce.engine.base``) is plain data: what a request asks for. ``grammar`` turns it
into llguidance's grammar text, ``check`` says in one line why a schema cannot be enforced (the
gateway's 400), and ``Masks`` is what the torch engine keeps: one tokenizer, a matcher per row,
the allowed tokens of the rows that have one.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

import numpy as np
import torch

from rlonce.engine.base import Constraint

JSON_OPTIONS = {"whitespace_flexible": False}
"""JSON as the APIs return it under a schema: compact, no free whitespace (a small model given
room for whitespace can spend its whole budget on it)."""


def json_schema(schema: dict) -> Constraint:
    return Constraint("json_schema", json.dumps(schema))  # property order kept: replies follow it


def json_object() -> Constraint:
    """Any JSON object (OpenAI's ``json_object`` response format)."""
    return json_schema({"type": "object"})


def regex(pattern: str) -> Constraint:
    return Constraint("regex", pattern)


def choice(options: list[str]) -> Constraint:
    if not options or not all(isinstance(o, str) and o for o in options):
        raise ValueError("a choice needs at least one non-empty string")
    return Constraint("choice", json.dumps(list(options)))


def lark(grammar_text: str) -> Constraint:
    return Constraint("lark", grammar_text)


def grammar(c: Constraint) -> str:
    """llguidance's grammar text for ``c``."""
    import llguidance

    M = llguidance.LLMatcher
    if c.kind == "json_schema":
        return M.grammar_from_json_schema(c.spec, defaults=JSON_OPTIONS)
    if c.kind == "regex":
        return M.grammar_from_regex(c.spec)
    if c.kind == "choice":
        return M.grammar_from_regex("|".join(re.escape(o) for o in json.loads(c.spec)))
    return M.grammar_from_lark(c.spec)


@lru_cache(maxsize=256)
def _problem(c: Constraint) -> str:
    import llguidance

    try:
        text = grammar(c)
    except ValueError as e:
        return f"not valid JSON: {e}"
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    if failed:
        return messages[0] if messages else "the grammar does not compile"
    return ""


def check(c: Constraint) -> str | None:
    """Why ``c`` cannot be enforced, in one line (a schema keyword llguidance does not implement, a
    regular expression it cannot compile); None when it can."""
    problem = _problem(c)
    return " ".join(problem.split())[:300] if problem else None


def allowed(bits_AW: torch.Tensor, vocab: int) -> torch.Tensor:
    """The boolean (A, vocab) mask of llguidance's packed bitmask rows (bit ``t % 32`` of word
    ``t // 32`` is token ``t``, little-endian)."""
    unpacked = np.unpackbits(bits_AW.numpy().view(np.uint8), axis=-1, bitorder="little")
    return torch.from_numpy(unpacked[:, :vocab]).bool()


class Masks:
    """The torch engine's constrained decoding: llguidance's view of the tokenizer (built on the
    first constrained request: a second or so for a 49k vocabulary), a matcher per constrained row,
    and the mask step. Runs on the engine's worker thread only."""

    def __init__(self, tokenizer, vocab: int, eos_token_ids: list[int]):
        self.tokenizer, self.vocab, self.eos = tokenizer, vocab, list(eos_token_ids)
        self._ll = None

    def matcher(self, c: Constraint):
        """A fresh matcher for ``c``, advanced over ``c.prefix``; ValueError when ``c`` cannot be
        enforced or the prefix does not match it."""
        import llguidance

        if self.tokenizer is None:
            raise ValueError("this engine was built without its tokenizer: constrained decoding needs it")
        problem = check(c)
        if problem:
            raise ValueError(f"the constraint cannot be enforced: {problem}")
        if self._ll is None:
            import llguidance.hf

            self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab, eos_token=self.eos)
        m = llguidance.LLMatcher(self._ll, grammar(c), log_level=0)
        if c.prefix and not m.consume_tokens(list(c.prefix)):
            raise ValueError(f"the tokens already sampled do not match the constraint: {m.get_error()}")
        if m.is_error():
            raise ValueError(f"the constraint cannot be enforced: {m.get_error()}")
        return m

    def apply(self, logits_AV: torch.Tensor, matchers: list) -> torch.Tensor:
        """``logits_AV`` with every token a row's matcher does not allow at −inf (rows whose matcher
        is None untouched). A finished matcher that allows nothing allows the end-of-turn tokens (the
        engine's may differ from the grammar's); one in error never reaches here (the engine fails
        its row)."""
        rows = [j for j, m in enumerate(matchers) if m is not None]
        bits = torch.zeros((len(rows), (self.vocab + 31) // 32), dtype=torch.int32)
        for i, j in enumerate(rows):
            matchers[j].unsafe_compute_mask_ptr(bits[i].data_ptr(), bits.shape[1] * 4)
        keep = allowed(bits, self.vocab)
        if logits_AV.shape[-1] > self.vocab:  # the model's padded vocabulary rows: never a token
            keep = torch.cat([keep, keep.new_zeros((len(rows), logits_AV.shape[-1] - self.vocab))], -1)
        empty = ~keep.any(-1)
        if bool(empty.any()):
            keep[empty.nonzero()[:, 0][:, None], torch.tensor(self.eos)[None]] = True
        out = logits_AV.clone()
        idx = torch.tensor(rows)
        out[idx] = out[idx].masked_fill(~keep, float("-inf"))
        return out

    @staticmethod
    def advance(matchers: list, tokens: list[int]) -> None:
        """Each constrained row's matcher consumes its sampled token (one it allowed)."""
        for m, t in zip(matchers, tokens):
            if m is not None and not m.is_stopped():
                m.consume_token(t)
