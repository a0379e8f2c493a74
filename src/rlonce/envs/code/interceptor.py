"""The action interceptor: a harness-level guard in front of the code domain's tools.

Seed 001 ("The environment can accidentally hand out the answer"): the public guard blocks a
suspicious action before dispatch and returns a bland denial instead of a new failure protocol,
so the trajectory stays well-formed. Patterns here cover the seeds' case table — digging in git
history for the fix, fetching upstream code, probing installed package versions, reading the
hidden-test paths. Each hit is counted per pattern; pattern matching has blind spots, which is
why grading never trusts the workspace anyway (``rlonce.envs.code.env``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

DENIAL = "Permission denied. Resource unavailable."

PATTERNS: dict[str, str] = {
    "git_history": r"\bgit\s+(?:-\S+\s+)*(?:log|reflog|fsck|show|cat-file|rev-list|for-each-ref|stash|"
                   r"fetch|pull|remote|verify-pack|unpack-objects|count-objects|lost-found)\b|\.git/(?:objects|refs|"
                   r"logs|packed-refs|ORIG_HEAD|FETCH_HEAD)",
    "fetch_upstream": r"\b(?:curl|wget|git\s+clone|svn|hg)\b|\bpip3?\s+(?:download|install)\b|-m\s+pip\b|"
                      r"\burllib\b|\brequests\.|\bhttp\.client\b|\bsocket\b|pypi\.org|pythonhosted|github\.com",
    "probe_versions": r"\bpip3?\s+(?:index|show|list|freeze)\b|importlib\.metadata|pkg_resources|"
                      r"site-packages|dist-packages|\.cache/pip",
}


@dataclass
class Interceptor:
    """Matches a tool call against named regular expressions; ``hidden_paths`` are denied too."""

    patterns: dict[str, str] = field(default_factory=lambda: dict(PATTERNS))
    hidden_paths: list[str] = field(default_factory=list)
    hits: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._compiled = {k: re.compile(v) for k, v in self.patterns.items()}

    def check(self, tool: str, arguments: dict) -> str | None:
        """The name of the first pattern the call matches (counted), or None. What is matched:
        a shell command, or the path of an editor call — never the text a file is given, which
        runs nothing (and code under repair may well mention ``socket`` or ``urllib``)."""
        text = str(arguments.get("command", "")) if tool == "bash" else str(arguments.get("path", ""))
        for name, rx in self._compiled.items():
            if rx.search(text):
                self.hits[name] += 1
                return name
        for p in self.hidden_paths:
            if p and p in text:
                self.hits["hidden_tests"] += 1
                return "hidden_tests"
        return None

    def metrics(self) -> dict[str, float]:
        names = [*self.patterns, "hidden_tests"]
        return {f"intercepted_{k}": float(self.hits.get(k, 0)) for k in names}
