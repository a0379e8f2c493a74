"""Offline build of the embedded model's byte-level BPE tokenizer (run once; output is shipped).

    python -m rlonce.recipes.build_tokenizer

Trained with ``tokenizers`` on dialogues of the embedded toolfind domain. The pre-tokenizer
splits letters, single digits and runs of other characters apart, so a word is the same
token whether a space, a quote or a slash precedes it — copying a word from an observation
into a tool call is then copying a token, which a tiny model learns quickly. Byte-level
fallback keeps every string encodable.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from rlonce.envs.toolfind.env import SYSTEM_PROMPT, ToolfindEnv
from rlonce.envs.toolfind.expert import expert_calls
from rlonce.envs.toolfind.tasks import make_task
from rlonce.envs.workspace import format_exec
from rlonce.model.chat import HermesFormat

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 1024
OUT = Path(__file__).parent / "embedded"


def _approx_output(task, command: str) -> str:
    files = dict(task.files)
    if command.startswith("ls"):
        return "\n".join(sorted(p.split("/")[1] for p in files))
    if command.startswith("cat"):
        return files.get(command.split()[1], "")
    if command == "pwd":
        return "/work"
    needle = command.split()[2]
    return "\n".join(f"{p}:{line}" for p, c in files.items() for line in c.splitlines() if needle in line)


def corpus(n: int = 3000, n_pretrain: int = 1500):
    from rlonce.recipes.pretrain import document, text_of

    prng = random.Random(99)
    for _ in range(n_pretrain):
        yield text_of(document(prng))
    fmt = HermesFormat()
    rng = random.Random(0)
    for i in range(n):
        task = make_task("train", 10_000_000 + i)
        env = ToolfindEnv(task)
        text = fmt.opening(SYSTEM_PROMPT, task.question, env.tools())
        for call in expert_calls(task, rng):
            text += fmt.assistant_text("", [call])
            if call.name == "bash":
                text += fmt.observation([format_exec(0, _approx_output(task, call.arguments["command"]), False)])
        yield text


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
