"""Offline pre-training of the embedded base model (run once; its weights are shipped).

    python -m rlonce.recipes.pretrain [--steps 600]

A real pretrained model arrives knowing how to copy a span and look a key up in its
context; a few-M-parameter model trained from scratch on agent demonstrations alone does
not get there on a CPU budget — the copy targets are a few tokens in hundreds, and the
model sits on a plateau for hundreds of steps. So the embedded base is pre-trained on
plain-text documents that are dense in exactly those generic skills:

  * fact tables (``key.field = value`` lines) followed by look-ups in three phrasings,
  * shell-like transcripts: ``$ ls``/``$ grep -r`` over small made-up files with the output a
    shell prints, the grep key written from a comment and the found value echoed back,
  * phrase rewriting (``the field of key -> key.field``) and word-list echoing.

Only the look-up answers, rewrites and echoes carry loss: the fact tables are random, and
training on them would only add noise to the gradient.

  * short chat-formatted tool-use dialogues (the model's own chat template): requests in
    several phrasings, a ``bash`` call that copies words from the request (``echo``, ``cat``,
    ``grep``), the tool's answer, and a ``reply`` call that copies the value found — the kind
    of tool-use data an instruct model is pre-trained on.

What the base does not see is the toolfind environment itself: its system prompt, its
question wording, its ``submit`` tool, its turn budget, or a real sandbox; those are what SFT
on the expert's demonstrations teaches. The documents are generated from the same
word lists the tokenizer was trained on, with seeds disjoint from every task split.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

from rlonce.envs.toolfind.tasks import ATTRIBUTES, ENTITIES, FILE_NAMES, LINKS, VALUES

WORDS = sorted(set(ENTITIES) | {v for vs in VALUES.values() for v in vs})
FIELDS = list(LINKS) + list(ATTRIBUTES)
OUT = Path(__file__).parent / "embedded"


def _facts(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    keys = rng.sample(ENTITIES, min(len(ENTITIES), max(2, n // 2)))
    seen, facts = set(), []
    while len(facts) < n:
        k, f = rng.choice(keys), rng.choice(FIELDS)
        if (k, f) in seen:
            continue
        seen.add((k, f))
        facts.append((k, f, rng.choice(ENTITIES if f in LINKS else VALUES[f])))
    return facts


Doc = list[tuple[str, bool]]
"""A document: text pieces, each with whether it is trained on (facts are random: no loss)."""


def doc_lookup(rng: random.Random) -> Doc:
    facts = _facts(rng, rng.randint(4, 8))
    doc: Doc = [("\n".join(f"{k}.{f} = {v}" for k, f, v in facts) + "\n", False)]
    for k, f, v in rng.choices(facts, k=rng.randint(4, 8)):
        form = rng.randrange(3)
        if form == 0:
            doc += [(f"the {f} of {k} is", False), (f" {v}\n", True)]
        elif form == 1:
            doc += [(f"{k}.{f} ?", False), (f" {v}\n", True)]
        else:
            doc += [(f"the {f} of {k} ->", False), (f" {k}.{f} = {v}\n", True)]
    return doc


def doc_shell(rng: random.Random) -> Doc:
    facts = _facts(rng, rng.randint(6, 12))
    names = rng.sample(FILE_NAMES, rng.randint(2, 4))
    files: dict[str, list[str]] = {n: [] for n in names}
    for i, (k, f, v) in enumerate(facts):
        files[names[i % len(names)]].append(f"{k}.{f} = {v}")
    d = rng.choice(["docs", "data", "notes"])
    doc: Doc = [(f"$ ls {d}\n" + "\n".join(f"{n}.txt" for n in sorted(names)) + "\n", False)]
    for _ in range(rng.randint(3, 6)):
        k, f, v = rng.choice(facts)
        hits = [(n, ln) for n in sorted(files) for ln in files[n] if ln.startswith(f"{k}.{f} ")]
        if rng.random() < 0.5:
            doc += [(f"# the {f} of {k}\n$ grep -r", False), (f" {k}.{f} {d}\n", True)]
        else:
            doc += [(f"$ grep -r {k}.{f} {d}\n", False)]
        doc += [("\n".join(f"{d}/{n}.txt:{ln}" for n, ln in hits) + "\n", False), ("$ echo", False),
                (f" {v}\n{v}\n", True)]
    return doc


def doc_rewrite(rng: random.Random) -> Doc:
    doc: Doc = []
    for _ in range(rng.randint(5, 10)):
        k, f = rng.choice(ENTITIES), rng.choice(FIELDS)
        if rng.random() < 0.5:
            doc += [(f"the {f} of {k} ->", False), (f" {k}.{f}\n", True)]
        else:
            ws = rng.sample(WORDS, rng.randint(2, 5))
            doc += [(f"echo {' '.join(ws)} ->", False), (f" {' '.join(ws)}\n", True)]
    return doc


PRE_SYSTEMS = (
    "You are a helpful assistant with tools.",
    "Use the tools to answer, then reply.",
    "You can run shell commands.",
)
DIRS = ("data", "notes", "files")


def _call(name: str, **arguments) -> str:
    from rlonce.model.chat import HermesFormat, ToolCall

    return HermesFormat().assistant_text("", [ToolCall(name, arguments)])


def doc_chat(rng: random.Random) -> Doc:
    """A short chat-formatted tool-use dialogue: copy words from the request into a shell
    command, read the tool's answer, copy the value into a ``reply`` call."""
    from rlonce.model.chat import HermesFormat

    fmt = HermesFormat()
    facts = _facts(rng, 6)
    d = rng.choice(DIRS)
    name = rng.choice(FILE_NAMES)
    kind = rng.randrange(4)
    k, f, v = rng.choice(facts)
    if kind == 0:
        ws = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
        user, cmds, outs, answer = f"Print {ws}.", [f"echo {ws}"], [ws], ws
    elif kind == 1:
        user = rng.choice([f"Show the {f} of {k}.", f"Look up {k}.{f} please.", f"Which {f} does {k} have?"])
        cmds, outs, answer = [f"grep -r {k}.{f} {d}"], [f"{d}/{name}.txt:{k}.{f} = {v}"], v
    elif kind == 2:
        link = rng.choice(LINKS)
        mid = rng.choice(ENTITIES)
        user = rng.choice([f"Show the {f} of the {link} of {k}.", f"Find the {link} of {k}, then its {f}."])
        cmds = [f"grep -r {k}.{link} {d}", f"grep -r {mid}.{f} {d}"]
        outs = [f"{d}/{name}.txt:{k}.{link} = {mid}", f"{d}/{rng.choice(FILE_NAMES)}.txt:{mid}.{f} = {v}"]
        answer = v
    else:
        lines = [f"{a}.{b} = {c}" for a, b, c in facts]
        user, cmds, outs, answer = f"Read {name}.txt in {d}.", [f"cat {d}/{name}.txt"], ["\n".join(lines)], lines[0]
    doc: Doc = [(fmt.opening(rng.choice(PRE_SYSTEMS), user, []), False)]
    for cmd, out in zip(cmds, outs):
        doc += [(_call("bash", command=cmd), True), (fmt.observation([out]), False)]
    doc += [(_call("reply", text=answer), True)]
    return doc


def document(rng: random.Random) -> Doc:
    return rng.choices([doc_chat, doc_lookup, doc_shell, doc_rewrite], weights=[12, 2, 2, 1])[0](rng)


def text_of(doc: Doc) -> str:
    return "".join(t for t, _ in doc)


def pretrain(steps: int, batch_rows: int = 32, lr: float = 3e-3, seed: int = 0, progress: bool = True,
             resume: bool = False):
    import torch
    from tqdm.auto import tqdm

    from rlonce.core.records import TrainingRow
    from rlonce.model.loader import init_embedded, load, materialize_embedded
    from rlonce.train.trainer import OptimSettings, Trainer

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="rlonce-pretrain-"))
    start = materialize_embedded(work / "init") if resume else init_embedded(work / "init", seed=seed)
    lm = load(start)
    rng = random.Random(10_000 + seed + (7 if resume else 0))
    eot = lm.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    trainer = Trainer(lm.model, OptimSettings(lr=lr, warmup_steps=30, total_steps=steps, betas=(0.9, 0.95)),
                      micro_batch_tokens=1 << 20)
    bar = tqdm(range(steps), desc="pretrain", disable=not progress)
    for _ in bar:
        rows = []
        for _ in range(batch_rows):
            ids, mask = [eot], [0]
            for text, trained in document(rng):
                piece = lm.encode(text)
                ids += piece
                mask += [int(trained)] * len(piece)
            n = len(ids)
            rows.append(TrainingRow(ids, mask, [0.0] * n, [1.0] * n, [0] * n))
        m = trainer.sft_step(rows)
        bar.set_postfix(loss=f"{m['sft_loss']:.3f}", refresh=False)
    return lm, work


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--resume", action="store_true", help="continue from the shipped weights")
    args = ap.parse_args()
    lm, work = pretrain(args.steps, lr=args.lr, resume=args.resume)
    lm.model.to(dtype=__import__("torch").bfloat16).save_pretrained(work / "final")
    shutil.copy(work / "final" / "model.safetensors", OUT / "model.safetensors")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {OUT / 'model.safetensors'}")


if __name__ == "__main__":
    main()
