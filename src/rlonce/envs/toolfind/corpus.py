"""The embedded model's corpus: the text its base was pre-trained and its tokenizer trained on
(``DomainSpec.base_corpus``; ``rlonce.recipes.pretrain``, ``rlonce.recipes.build_tokenizer``).

A real pretrained model arrives knowing how to copy a span and look a key up in its context; a
few-M-parameter model trained from scratch on agent demonstrations alone does not get there on a
CPU budget. So the embedded base is pre-trained on plain-text documents (``document``) dense in
exactly those generic skills, written with toolfind's word lists:

  * fact tables (``key.field = value`` lines) followed by look-ups in three phrasings,
  * shell-like transcripts: ``$ ls``/``$ grep -r`` over small made-up files with the output a
    shell prints, the grep key written from a comment and the found value echoed back,
  * phrase rewriting (``the field of key -> key.field``) and word-list echoing,
  * short chat-formatted tool-use dialogues (the model's own chat template): requests in
    several phrasings, a ``bash`` call that copies words from the request (``echo``, ``cat``,
    ``grep``), the tool's answer, and a ``reply`` call that copies the value found.

Only the look-up answers, rewrites, echoes and the dialogues' calls carry loss: the fact tables
are random, and training on them would only add noise to the gradient. What the base does not
see is the toolfind environment itself (its system prompt, question wording, ``submit`` tool,
turn budget, sandbox): SFT on the expert's demonstrations teaches those.

The tokenizer is trained on some of these documents and on toolfind's own dialogues
(``dialogues``: the expert solving train tasks, with approximate tool output), so a word copied
from an observation into a tool call is one token.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from rlonce.envs.toolfind.env import SYSTEM_PROMPT, ToolfindEnv
from rlonce.envs.toolfind.expert import expert_calls
from rlonce.envs.toolfind.tasks import ATTRIBUTES, ENTITIES, FILE_NAMES, LINKS, VALUES, ToolfindTask, make_task
from rlonce.envs.workspace import format_exec
from rlonce.model.chat import ChatFormat, ToolCall

WORDS = sorted(set(ENTITIES) | {v for vs in VALUES.values() for v in vs})
FIELDS = list(LINKS) + list(ATTRIBUTES)


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


def _call(fmt: ChatFormat, name: str, **arguments) -> str:
    return fmt.assistant_text("", [ToolCall(name, arguments)])


def doc_chat(rng: random.Random, fmt: ChatFormat) -> Doc:
    """A short chat-formatted tool-use dialogue: copy words from the request into a shell
    command, read the tool's answer, copy the value into a ``reply`` call."""
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
        doc += [(_call(fmt, "bash", command=cmd), True), (fmt.observation([out]), False)]
    doc += [(_call(fmt, "reply", text=answer), True)]
    return doc


def document(rng: random.Random, fmt: ChatFormat) -> Doc:
    """One pre-training document: mostly a chat dialogue, else a look-up, a shell transcript or a rewrite."""
    kind = rng.choices([doc_chat, doc_lookup, doc_shell, doc_rewrite], weights=[12, 2, 2, 1])[0]
    return kind(rng, fmt) if kind is doc_chat else kind(rng)


DIALOGUE_TASKS = 10_000_000
"""Where the tokenizer's dialogues start among the train tasks (beyond those a run trains on)."""


def _approx_output(task: ToolfindTask, command: str) -> str:
    files = dict(task.files)
    if command.startswith("ls"):
        return "\n".join(sorted(p.split("/")[1] for p in files))
    if command.startswith("cat"):
        return files.get(command.split()[1], "")
    if command == "pwd":
        return "/work"
    needle = command.split()[2]
    return "\n".join(f"{p}:{line}" for p, c in files.items() for line in c.splitlines() if needle in line)


def dialogues(n: int, fmt: ChatFormat) -> Iterator[str]:
    """``n`` toolfind train tasks solved by the expert (detours included), each as one chat-formatted
    text: the opening, then each call with an approximation of what the sandbox would print."""
    rng = random.Random(0)
    for i in range(n):
        task = make_task("train", DIALOGUE_TASKS + i)
        text = fmt.opening(SYSTEM_PROMPT, task.question, ToolfindEnv(task).tools())
        for call in expert_calls(task, rng):
            text += fmt.assistant_text("", [call])
            if call.name == "bash":
                text += fmt.observation([format_exec(0, _approx_output(task, call.arguments["command"]), False)])
        yield text
