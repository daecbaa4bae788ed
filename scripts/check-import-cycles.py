#!/usr/bin/env python3
"""Module import cycles of Rust crates: the `use crate::…` graph (make lint).

    scripts/check-import-cycles.py [CRATE_DIR ...]      (default: every crate under crates/)

Each source file under a crate's `src/` is a module (`src/a/b.rs` and
`src/a/b/mod.rs` are `a::b`; `lib.rs`/`main.rs` the root; each `src/bin/*.rs` a
crate of its own). A module depends on another when it names it by a
`crate::…` or `super::…` path, in a `use` or inline. A module naming its own
descendants does not count: a parent declares and re-exports its children, and
its children may take what they share from it, so shared items go "up" to the
parent. Every other cycle (siblings, cousins, a child and an unrelated module)
is reported, with the paths that make each edge; the exit status is 1 if any.

A file longer than --max-lines (default 800) is reported too, test files
(`tests.rs`, `*_tests.rs`, `tests/`, `benches/`) aside.
"""

import argparse
import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
INLINE_PATH = re.compile(rf"\b(crate|super)((?:::{IDENT})+)")
INLINE_MOD = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*\{{")
USE_START = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+")


def module_path(src: Path, file: Path):
    """The module path of a file under src/ (a tuple), or None for a bin root."""
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "bin":
        return None
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments_and_strings(text: str) -> str:
    """Source without comments, string and char literals (kept line for line)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or re.match(r"'\\[xu]", text[i:i + 3]):
            j = text.find("'", i + 2)
            i = n if j < 0 else j + 1
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use_tree(tree: str):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(rf"\bas{IDENT}", "", tree)  # `as` renames (whitespace already gone)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        m = s.find("{")
        if m < 0:
            yield prefix + s
            return
        head, body = s[:m], s[m + 1:s.rfind("}")]
        for part in split_top(body):
            yield from walk(prefix + head, part)

    return list(walk("", tree))


def resolve(modules, here, kind, rest):
    """The module file a `crate::…`/`super::…` path lands in (or None)."""
    segs = [s for s in rest.split("::") if s]
    if kind == "crate":
        base = ()
    else:
        base = here[:-1] if here else ()
        while segs and segs[0] == "super":
            segs, base = segs[1:], base[:-1]
    segs = [s for s in segs if s != "self"]
    best = base if base in modules else None
    for k in range(1, len(segs) + 1):
        cand = base + tuple(segs[:k])
        if cand in modules:
            best = cand
    return best


def references(text: str):
    """(kind, rest, line) for every crate::/super:: path in a file, and the
    inline-module nesting at that point (a `super` inside `mod tests {…}`
    is the file's own module)."""
    clean = strip_comments_and_strings(text)
    lines = clean.split("\n")
    depth, inline = 0, []  # inline: brace depths where inline modules opened
    i = 0
    while i < len(lines):
        line = lines[i]
        if USE_START.match(line):
            stmt, j = line, i
            while ";" not in stmt and j + 1 < len(lines):
                j += 1
                stmt += lines[j]
            body = USE_START.sub("", stmt, count=1).split(";")[0]
            for path in expand_use_tree(body):
                m = re.match(r"(crate|super)((?:::\w+)*)", path)
                if m:
                    yield m.group(1), m.group(2), i + 1, len(inline)
            for k in range(i, j + 1):
                depth += lines[k].count("{") - lines[k].count("}")
            i = j + 1
            continue
        for m in INLINE_PATH.finditer(line):
            yield m.group(1), m.group(2), i + 1, len(inline)
        if INLINE_MOD.match(line):
            inline.append(depth)
        depth += line.count("{") - line.count("}")
        while inline and depth <= inline[-1]:
            inline.pop()
        i += 1


def crate_graph(crate: Path):
    src = crate / "src"
    files = {}
    for f in sorted(src.rglob("*.rs")):
        mp = module_path(src, f)
        if mp is not None:
            files[mp] = f
    edges = {m: {} for m in files}
    for here, f in files.items():
        for kind, rest, line, nested in references(f.read_text(errors="replace")):
            if kind == "super" and nested:
                # `super` inside an inline module: strip one level per nesting.
                rest_segs = rest.split("::")[1:]
                n_super = 1
                while rest_segs and rest_segs[0] == "super":
                    rest_segs, n_super = rest_segs[1:], n_super + 1
                if n_super <= nested:
                    continue  # names the file's own module (or an inline one)
                rest = "::super" * (n_super - nested - 1) + "".join("::" + s for s in rest_segs)
            target = resolve(files, here, kind, rest)
            if target is None or target == here or target[: len(here)] == here:
                continue  # itself, or its own descendant
            edges[here].setdefault(target, []).append(f"{f.relative_to(crate)}:{line}: {kind}{rest}")
    return files, edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def is_test_file(f: Path) -> bool:
    return f.name == "tests.rs" or f.stem.endswith("_tests") or "tests" in f.parts or "benches" in f.parts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("crates", nargs="*", type=Path)
    ap.add_argument("--max-lines", type=int, default=800)
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    crates = args.crates or sorted(p.parent for p in (root / "crates").glob("*/Cargo.toml"))
    bad = 0
    for crate in crates:
        files, edges = crate_graph(crate)
        name = lambda m: "::".join(m) or "(root)"
        for comp in cycles(edges):
            bad += 1
            print(f"{crate}: import cycle among {', '.join(name(m) for m in comp)}")
            members = set(comp)
            for m in comp:
                for t, refs in sorted(edges[m].items()):
                    if t in members:
                        print(f"    {name(m)} -> {name(t)}: {refs[0]}" + (f" (+{len(refs) - 1} more)" if len(refs) > 1 else ""))
        for f in sorted(crate.joinpath("src").rglob("*.rs")):
            if is_test_file(f.relative_to(crate)):
                continue
            n = f.read_text(errors="replace").count("\n")
            if n > args.max_lines:
                bad += 1
                print(f"{f}: {n} lines (over {args.max_lines}; split it by concept)")
    if bad:
        print(f"{bad} problem(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
