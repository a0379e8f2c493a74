"""Offline build of the embedded model's byte-level BPE tokenizer (run once; output is shipped).

    python -m rlonce.recipes.build_tokenizer

Trained with ``tokenizers`` on the embedded model's corpus (its domain's ``base_corpus``, through
the registry: pre-training documents and the expert's dialogues on its tasks). The pre-tokenizer
splits letters, single digits and runs of other characters apart, so a word is the same
token whether a space, a quote or a slash precedes it — copying a word from an observation
into a tool call is then copying a token, which a tiny model learns quickly. Byte-level
fallback keeps every string encodable.
"""

from __future__ import annotations

import json
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from rlonce.model.chat import HermesFormat
from rlonce.model.loader import EMBEDDED_DIR
from rlonce.recipes.pretrain import base_corpus, text_of

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 1024
OUT = EMBEDDED_DIR
"""Where the shipped embedded model lives (``rlonce.model.loader``); the recipe overwrites its file there."""


def corpus(n: int = 3000, n_pretrain: int = 1500):
    """``n_pretrain`` pre-training documents, then ``n`` dialogues, in the embedded chat format."""
    source, fmt = base_corpus(), HermesFormat()
    prng = random.Random(99)
    for _ in range(n_pretrain):
        yield text_of(source.document(prng, fmt))
    yield from source.dialogues(n, fmt)


def build() -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[A-Za-z]+|[0-9]|[^A-Za-z0-9]+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL + ADDED, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def main() -> None:
    tok = build()
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": t in SPECIAL}
        for t in SPECIAL + ADDED
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
        "chat_format": "hermes",
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"wrote {OUT} (vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
