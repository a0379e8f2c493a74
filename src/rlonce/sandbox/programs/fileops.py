"""One file operation inside a sandbox: view, read, create, write, str_replace, edit, insert,
glob, or a ``*** Begin Patch`` patch.

Run as ``python3 -c <this source> <base64 JSON>`` with the workspace as the working directory
(``rlonce.sandbox.fileops.file_op_command``); the JSON holds ``op`` and its arguments. It prints
the result, or ``error: <why>`` for a request it cannot carry out, and exits 0 either way;
anything else (a file it may not open, a number that is not one) ends in a traceback and exit
status 1.

Why inside the sandbox: paths resolve in the sandbox's mount namespace, so a symlink the agent
planted can never make the host read or write outside the workspace. The program itself guards
nothing: it follows links, writes wherever the sandbox lets it and trusts its arguments.
Standard library only: rlonce is not installed where it runs.
"""
import base64
import glob
import json
import os
import sys


class OpError(Exception):
    """A request this program cannot carry out; printed as ``error: <message>``."""


def path_arg(args, key):
    p = args.get(key)
    if not isinstance(p, str) or not p:
        raise OpError(f"'{key}' must be a non-empty path")
    return p


def read_text(p):
    if not os.path.isfile(p):
        raise OpError(f"{p} does not exist")
    with open(p, errors="replace") as f:
        return f.read()


def write_text(p, text):
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    with open(p, "w") as f:
        f.write(text)


def numbered(lines, start=1):
    """``lines`` with 6-wide line numbers from ``start`` and a tab, as ``cat -n`` prints them."""
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, start))


def show(p, first_line, limit):
    """A directory's sorted entries, or up to ``limit`` numbered lines of a file from ``first_line()``."""
    if os.path.isdir(p):
        return "\n".join(sorted(os.listdir(p)))
    lines = read_text(p).splitlines()
    lo = first_line()
    n = int(limit or len(lines))
    return numbered(lines[lo - 1:lo - 1 + n], lo) if lines else "[empty file]"


def view(args):
    """The editor's ``view``: from ``view_range[0]`` (the range's end is not used)."""
    return show(path_arg(args, "path"), lambda: int((args.get("view_range") or [1])[0]), args.get("limit"))


def read(args):
    """Read: ``limit`` lines from line ``offset``."""
    return show(path_arg(args, "file_path"), lambda: int(args.get("offset") or 1), args.get("limit"))


def create(args):
    p = path_arg(args, "path")
    if os.path.exists(p):
        raise OpError(f"{p} already exists; use str_replace")
    write_text(p, args.get("file_text", ""))
    return f"created {p}"


def write(args):
    p = path_arg(args, "file_path")
    write_text(p, args.get("content", ""))
    return f"wrote {p}"


def replace(p, old, new, replace_all):
    """Replace ``old`` by ``new`` in file ``p``: its one occurrence, or every one with ``replace_all``."""
    text = read_text(p)
    n = text.count(old) if old else 0
    if n == 0 or (n > 1 and not replace_all):
        raise OpError(f"the old text occurs {n} times in {p}; it must occur exactly once")
    write_text(p, text.replace(old, new) if replace_all else text.replace(old, new, 1))
    return f"edited {p}"


def str_replace(args):
    p = path_arg(args, "path")
    return replace(p, args.get("old_str") or "", args.get("new_str") or "", args.get("replace_all"))


def edit(args):
    p = path_arg(args, "file_path")
    return replace(p, args.get("old_string") or "", args.get("new_string") or "", args.get("replace_all"))


def insert(args):
    """Insert ``new_str`` as whole lines after line ``insert_line`` (0: at the top)."""
    p = path_arg(args, "path")
    lines = read_text(p).splitlines(True)
    k = int(args.get("insert_line", 0))
    if not 0 <= k <= len(lines):
        raise OpError(f"insert_line must be in [0, {len(lines)}]")
    new = args.get("new_str", "")
    lines.insert(k, new if new.endswith("\n") else new + "\n")
    write_text(p, "".join(lines))
    return f"inserted into {p}"


def glob_files(args):
    """Paths matching ``pattern`` (``**`` recursive) under ``path``, sorted, relative to the workspace."""
    base = args.get("path") or "."
    hits = sorted(glob.glob(os.path.join(base, path_arg(args, "pattern")), recursive=True))
    return "\n".join(os.path.relpath(h) for h in hits) if hits else "[no matches]"


def patch(args):
    """Apply a ``*** Begin Patch`` ... ``*** End Patch`` patch of Add/Delete/Update File sections.
    Sections apply in order; one that fails stops the patch, leaving the earlier ones applied."""
    lines = (args.get("input") or "").splitlines()
    if not lines or lines[0].strip() != "*** Begin Patch":
        raise OpError("a patch starts with '*** Begin Patch'")
    i, done = 1, []
    while i < len(lines) and lines[i].strip() != "*** End Patch":
        line = lines[i]
        if line.startswith("*** Add File: "):
            p, body, i = line[14:].strip(), [], i + 1
            while i < len(lines) and lines[i].startswith("+"):
                body.append(lines[i][1:])
                i += 1
            write_text(p, "\n".join(body) + "\n")
            done.append("A " + p)
        elif line.startswith("*** Delete File: "):
            p = line[17:].strip()
            read_text(p)
            os.remove(p)
            done.append("D " + p)
            i += 1
        elif line.startswith("*** Update File: "):
            i, dest = update_file(lines, i + 1, line[17:].strip())
            done.append("M " + dest)
        else:
            raise OpError(f"patch line {i + 1} is not a file operation: {line[:60]!r}")
    if not done:
        raise OpError("the patch holds no file operation")
    return "applied:\n" + "\n".join(done)


def update_file(lines, i, p):
    """Apply the hunks of an ``*** Update File: p`` section whose body starts at ``lines[i]``
    (an optional ``*** Move to:`` first); returns the index after the section and the path written."""
    dest = p
    if i < len(lines) and lines[i].startswith("*** Move to: "):
        dest, i = lines[i][13:].strip(), i + 1
    content, pos = read_text(p).split("\n"), 0
    while i < len(lines) and not lines[i].startswith("*** "):
        if lines[i].startswith("@@"):
            i += 1
            continue
        old, new, i = hunk(lines, i)
        at = find_lines(content, old, pos)
        if at is None:
            raise OpError(f"a hunk of the patch for {p} does not match the file")
        content[at:at + len(old)] = new
        pos = at + len(new)
    write_text(dest, "\n".join(content))
    if dest != p:
        os.remove(p)
    return i, dest


def hunk(lines, i):
    """The old and new lines of the hunk starting at ``lines[i]``, and the index after it."""
    old, new = [], []
    while i < len(lines) and not lines[i].startswith(("@@", "*** ")):
        tag, text = (lines[i][:1], lines[i][1:]) if lines[i] else (" ", "")
        if tag not in " -+":
            raise OpError(f"patch line {i + 1} must start with ' ', '-' or '+'")
        if tag != "+":
            old.append(text)
        if tag != "-":
            new.append(text)
        i += 1
    return old, new, i


def find_lines(content, old, start):
    """The first index from ``start`` where ``old`` occurs in ``content`` as consecutive lines, or None."""
    return next((k for k in range(start, len(content) - len(old) + 1) if content[k:k + len(old)] == old), None)


OPS = {"view": view, "read": read, "create": create, "write": write, "str_replace": str_replace, "edit": edit,
       "insert": insert, "glob": glob_files, "patch": patch}


def run(op, args):
    """The text ``op`` prints for ``args``; raises ``OpError`` for a request it cannot carry out."""
    fn = OPS.get(op) if isinstance(op, str) else None
    if fn is None:
        raise OpError(f"unknown operation {op!r}")
    return fn(args)


def main(argv):
    args = json.loads(base64.b64decode(argv[1]))
    op = args.pop("op")
    try:
        print(run(op, args))
    except OpError as e:
        print("error: " + str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
