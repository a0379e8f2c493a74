"""Summarise the corpus: per file, the paths hit, top-level body keys, roles, content block /
input item types, tool types and the statuses the gateway answered.

    python tests/compat/summarize.py [tests/compat/corpus/*.jsonl]   # Markdown on stdout
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent / "corpus"


def blocks(content, out: Counter) -> None:
    if isinstance(content, list):
        for c in content:
            if isinstance(c, dict):
                out[c.get("type", "?")] += 1
                if c.get("type") == "tool_result":
                    blocks(c.get("content"), out)
                if c.get("type") == "function_call_output":
                    blocks(c.get("output"), out)


def summarise(rows: list[dict]) -> dict:
    s = {k: Counter() for k in ("paths", "keys", "roles", "blocks", "items", "tools", "status")}
    for r in rows:
        n = r.get("repeats", 1)
        s["paths"][f"{r['method']} {r['path']}" + (f"?{r['query']}" if r["query"] else "")] += n
        s["status"][str(r["status"])] += n
        b = r.get("body")
        if not isinstance(b, dict):
            continue
        s["keys"].update(b.keys())
        msgs = b.get("messages") or []
        if isinstance(b.get("input"), list):
            msgs = b["input"]
        for m in msgs:
            if not isinstance(m, dict):
                continue
            if "role" in m:
                s["roles"][m["role"]] += 1
            if "type" in m:
                s["items"][m["type"]] += 1
            blocks(m.get("content"), s["blocks"])
            blocks(m.get("output"), s["blocks"])
        if isinstance(b.get("system"), list):
            blocks(b["system"], s["blocks"])
        for t in b.get("tools") or []:
            s["tools"][t.get("type", "(custom, no type)")] += 1
    return s


def fmt(c: Counter) -> str:
    return ", ".join(f"`{k}`" + (f" ×{v}" if v > 1 else "") for k, v in sorted(c.items())) or "—"


def main(argv=None) -> None:
    paths = [Path(p) for p in (argv or sys.argv[1:])] or sorted(HERE.glob("*.jsonl"))
    for p in paths:
        rows = [json.loads(line) for line in p.open()]
        s = summarise(rows)
        print(f"#### `{p.name}` ({', '.join(sorted({r['client'] for r in rows}))}; "
              f"{sum(r.get('repeats', 1) for r in rows)} requests, {len(rows)} lines)\n")
        for k, label in (("paths", "paths"), ("status", "gateway status"), ("keys", "top-level keys"),
                         ("roles", "roles"), ("items", "input item types"),
                         ("blocks", "content block types"), ("tools", "tool types")):
            print(f"- {label}: {fmt(s[k])}")
        print()


if __name__ == "__main__":
    main()
