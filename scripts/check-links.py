#!/usr/bin/env python3
"""Check that every relative link in the repository's Markdown files resolves.

For each `*.md` file git knows about (tracked, or new and not ignored), every
inline link or image (`[text](target)`, `![alt](target)`), reference
definition (`[ref]: target`) and HTML `href`/`src` outside code is checked:

- `http(s):`, `mailto:` and other URLs with a scheme are skipped;
- a path must name a file or directory of the repository that git does not
  ignore (relative to the Markdown file; a leading `/` is the repository's root),
  so a clone of the repository alone has no dead link;
- `#anchor` (alone, or after a `.md` path) must be a heading of that file, by
  GitHub's slug rules (lower case, punctuation dropped, spaces to `-`, repeats
  numbered `-1`, `-2`, ...), or an explicit `id=`/`name=` anchor.

Prints each broken link as `path:line: link (why)` and exits 1 if there is one.
Usage: python3 scripts/check-links.py [REPO_DIR]
"""

import os
import re
import subprocess
import sys
import unicodedata
from urllib.parse import unquote

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of
# brackets (an image inside a link).
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]*(?:\([^\s)]*\)[^\s)]*)*)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']*)["']""", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"""<[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def git(repo, *args):
    out = subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True)
    return [line for line in out.stdout.split("\n") if line]


def known_paths(repo):
    """Files git tracks or would track (not ignored), and every directory above them."""
    files = set(git(repo, "ls-files", "--cached", "--others", "--exclude-standard"))
    dirs = {""}
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    return files, dirs


def heading_text(raw):
    """The text GitHub renders for a heading's Markdown: links, code and emphasis marks gone."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    text = re.sub(r"(\*+)(\S.*?)\1", r"\2", text)
    return text


def slug(text):
    """GitHub's anchor of a heading: lower case, keep letters, marks, digits,
    `_`, `-` and spaces, then each space becomes `-`."""
    out = []
    for ch in text.strip().lower():
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def scan(text):
    """Lines outside fenced code, each with its number: (lineno, line)."""
    fence = None
    for lineno, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        yield lineno, line


def anchors(text):
    seen = {}
    result = set()
    previous = ""
    for _, line in scan(text):
        heading = None
        m = ATX_HEADING.match(line)
        if m:
            heading = m.group(2) or ""
        elif SETEXT_UNDERLINE.match(line) and previous.strip() and not previous.startswith(("    ", "\t")):
            heading = previous.strip()
        if heading is not None:
            base = slug(heading_text(heading))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        for a in HTML_ANCHOR.findall(line):
            result.add(a)
        previous = line
    return result


def links(text):
    for lineno, line in scan(text):
        plain = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        found = [m.group(1) for m in INLINE_LINK.finditer(plain)]
        m = REFERENCE_DEF.match(plain)
        if m:
            found.append(m.group(1))
        found += HTML_ATTR.findall(plain)
        for target in found:
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            yield lineno, target


def check(repo):
    files, dirs = known_paths(repo)
    anchor_cache = {}

    def anchors_of(path):
        if path not in anchor_cache:
            with open(os.path.join(repo, path), encoding="utf-8") as f:
                anchor_cache[path] = anchors(f.read())
        return anchor_cache[path]

    broken = []
    for md in sorted(f for f in files if f.endswith(".md")):
        with open(os.path.join(repo, md), encoding="utf-8") as f:
            text = f.read()
        for lineno, target in links(text):
            if not target or SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            path = unquote(path.split("?", 1)[0])
            if path:
                base = "" if path.startswith("/") else os.path.dirname(md)
                resolved = os.path.normpath(os.path.join(base, path.lstrip("/")))
                if resolved == ".":
                    resolved = ""
                if resolved.startswith(".."):
                    broken.append((md, lineno, target, "outside the repository"))
                    continue
                if resolved not in files and resolved not in dirs:
                    broken.append((md, lineno, target, "no such file"))
                    continue
            else:
                resolved = md
            if anchor and resolved.endswith(".md") and resolved in files:
                if unquote(anchor) not in anchors_of(resolved):
                    broken.append((md, lineno, target, f"no heading #{anchor} in {resolved}"))
    return broken


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    repo = git(repo, "rev-parse", "--show-toplevel")[0]
    broken = check(repo)
    for md, lineno, target, why in broken:
        print(f"{md}:{lineno}: {target} ({why})")
    if broken:
        print(f"check-links: {len(broken)} broken link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
