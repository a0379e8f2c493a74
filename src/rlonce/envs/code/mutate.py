"""Bug injection by AST mutation, applied as a minimal text edit.

Each operator finds sites in a module's AST and proposes a replacement of one source span (byte
offsets from the node positions), so the rest of the file — comments, formatting — is untouched
and the reference fix is a one-hunk diff. ``ast.unparse`` would rewrite the whole file and make
the fix a rewrite of everything.

Operators: ``binop`` (``+``↔``-``, ``*``→``//``, ``//``→``*``, ``%``→``//``), ``compare``
(``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``, ``in``↔``not in``, ``is``↔``is not``),
``off_by_one`` (an int literal n → n+1), ``swap_args`` (first two positional arguments of a
call), ``drop_branch`` (an ``if`` test → ``False``: the branch never runs), ``bool_op``
(``and``↔``or``), ``wrong_default`` (a parameter's default: bool flipped, int + 1, None → 0),
``return_none`` (``return expr`` → ``return None``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Mutation:
    path: str
    """File, relative to the package root."""
    operator: str
    start: int
    end: int
    """Byte span of the original text that ``replacement`` takes the place of."""
    original: str
    replacement: str
    line: int
    function: str
    """Qualified name of the enclosing function ('<module>' at top level)."""

    def apply(self, source: bytes) -> bytes:
        if source[self.start:self.end].decode() != self.original:
            raise ValueError(f"{self.path}: mutation site changed (expected {self.original!r})")
        return source[:self.start] + self.replacement.encode() + source[self.end:]

    def to_dict(self) -> dict:
        return asdict(self)


class _Offsets:
    def __init__(self, source: bytes):
        self.source = source
        self.starts = [0]
        for i, b in enumerate(source):
            if b == 10:
                self.starts.append(i + 1)

    def at(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


_BINOP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*"),
          ast.Mod: ("%", "//")}
_CMP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
        ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
        ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}


def _between(off: _Offsets, a, b, token: str):
    """The span of ``token`` in the text between nodes ``a`` and ``b`` (exactly one occurrence)."""
    lo, hi = off.span(a)[1], off.span(b)[0]
    text = off.source[lo:hi].decode()
    if token[0].isalpha():
        pat = r"\b" + r"\s+".join(map(re.escape, token.split())) + r"\b"
    else:
        pat = r"(?<![=<>!*/%+-])" + re.escape(token) + r"(?![=<>*/])"
    hits = list(re.finditer(pat, text))
    if len(hits) != 1:
        return None
    m = hits[0]
    return lo + len(text[:m.start()].encode()), lo + len(text[:m.end()].encode()), m.group(0)


def _scoped(tree: ast.AST):
    """Yield (node, qualified name of its scope) over the tree; a def or class is its own scope."""
    stack: list[tuple[ast.AST, str]] = [(tree, "<module>")]
    while stack:
        node, fn = stack.pop()
        for child in ast.iter_child_nodes(node):
            name = fn
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = child.name if fn == "<module>" else f"{fn}.{child.name}"
            stack.append((child, name))
        yield node, fn


def _sites(tree: ast.AST, off: _Offsets):
    """Yield (operator, start, end, original, replacement, node, function) over the tree."""
    for node, fn in _scoped(tree):
        yield from _node_sites(node, fn, off)


def _node_sites(node, fn, off: _Offsets):
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        tok, rep = _BINOP[type(node.op)]
        hit = _between(off, node.left, node.right, tok)
        if hit:
            yield "binop", hit[0], hit[1], hit[2], rep, node, fn
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        tok, rep = _CMP[type(node.ops[0])]
        hit = _between(off, node.left, node.comparators[0], tok)
        if hit:
            yield "compare", hit[0], hit[1], hit[2], rep, node, fn
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        tok, rep = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        hit = _between(off, node.values[0], node.values[1], tok)
        if hit:
            yield "bool_op", hit[0], hit[1], hit[2], rep, node, fn
    elif (isinstance(node, ast.Call) and len(node.args) >= 2
          and not any(isinstance(a, ast.Starred) for a in node.args[:2])):
        (s0, e0), (s1, e1) = off.span(node.args[0]), off.span(node.args[1])
        a0, a1 = off.source[s0:e0].decode(), off.source[s1:e1].decode()
        if a0 != a1:
            mid = off.source[e0:s1].decode()
            yield "swap_args", s0, e1, a0 + mid + a1, a1 + mid + a0, node, fn
    elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Constant)):
        s, e = off.span(node.test)
        yield "drop_branch", s, e, off.source[s:e].decode(), "False", node, fn
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        s, e = off.span(node.value)
        yield "return_none", s, e, off.source[s:e].decode(), "None", node, fn
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for d in [*node.args.defaults, *[k for k in node.args.kw_defaults if k is not None]]:
            if isinstance(d, ast.Constant) and (d.value is None or isinstance(d.value, (bool, int))):
                s, e = off.span(d)
                v = d.value
                rep = "0" if v is None else str(not v) if isinstance(v, bool) else str(v + 1)
                yield "wrong_default", s, e, off.source[s:e].decode(), rep, d, node.name
    if isinstance(node, ast.Constant) and type(node.value) is int and getattr(node, "lineno", None):
        s, e = off.span(node)
        text = off.source[s:e].decode()
        if text.isdigit():
            yield "off_by_one", s, e, text, str(node.value + 1), node, fn


OPERATORS = ("binop", "compare", "off_by_one", "swap_args", "drop_branch", "bool_op", "wrong_default",
             "return_none")


def function_spans(source: bytes) -> dict[str, list[tuple[int, int]]]:
    """First and last line of every function of ``source`` (the ``def`` line first, decorators left
    out), by the qualified name a ``Mutation.function`` carries ('Class.method'); a name defined
    more than once (branches that each define it) has a span for each, in source order."""
    out: dict[str, list[tuple[int, int]]] = {}
    for node, fn in _scoped(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(fn, []).append((node.lineno, node.end_lineno))
    return out


def function_lengths(source: bytes) -> dict[str, int]:
    """Lines of every function of ``source`` (decorators left out; a name defined twice, its last
    definition), by qualified name."""
    return {fn: spans[-1][1] - spans[-1][0] + 1 for fn, spans in function_spans(source).items()}


def in_tier(m: Mutation, lengths: dict[str, int], operators: tuple[str, ...] | None,
            max_function_lines: int | None) -> bool:
    """Whether a mutation site is one an easier tier draws (``rlonce tasks build code``'s settings):
    one of ``operators`` (None: any) inside a function of at most ``max_function_lines`` lines
    (None: any site, module level included)."""
    if operators is not None and m.operator not in operators:
        return False
    return max_function_lines is None or lengths.get(m.function, max_function_lines + 1) <= max_function_lines


def find_mutations(path: str, source: bytes) -> list[Mutation]:
    """Every mutation site of ``source`` in a deterministic order (by position, then operator)."""
    tree = ast.parse(source)
    off = _Offsets(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for op, s, e, orig, rep, node, fn in _sites(tree, off):
        if id(node) in docstrings or orig == rep:
            continue
        out.append(Mutation(path, op, s, e, orig, rep, node.lineno, fn))
    out.sort(key=lambda m: (m.start, OPERATORS.index(m.operator), m.end))
    unique, seen = [], set()
    for m in out:
        if (m.start, m.end, m.replacement) not in seen:
            seen.add((m.start, m.end, m.replacement))
            unique.append(m)
    return unique
