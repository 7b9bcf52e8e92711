#!/usr/bin/env python3
"""Fails when the modules under src/ import each other in a cycle.

Each file is one module. An edge A -> B means that A names something of B through a path:
`use crate::...`, `use super::...`, `use self::...`, a `use` of a child module by its bare
name, or a `crate::a::b` path written inline. A path resolves to the deepest module file that
exists for it, so `crate::gate::Claim` points at src/gate/mod.rs and `crate::gate::claim::Claim`
at src/gate/claim.rs. Declaring a child (`mod x;`) is not an edge; re-exporting from it is.

Prints every strongly connected group of more than one file with the edges that tie it, and
exits 1 if there is any. Usage: scripts/check-cycles.py [src-dir]
"""

import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
SRC = os.path.normpath(SRC)


def module_of(path):
    rel = os.path.relpath(path, SRC)[: -len(".rs")].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


files = {}
for root, _, names in os.walk(SRC):
    for name in names:
        if name.endswith(".rs"):
            path = os.path.join(root, name)
            mod = module_of(path)
            # main.rs is a binary of its own; lib.rs is the root.
            if name == "main.rs" and root == SRC:
                continue
            files[mod] = path


def strip_comments(text):
    """Code only: comments go, and string and char literals become empty ("", ' ')."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) and re.match(r'b?r#*"', text[i:]):
            m = re.match(r'b?r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'":
            m = re.match(r"'(?:\\(?:x..|u\{[0-9a-fA-F]+\}|.)|[^\\'])'", text[i:], flags=re.S)
            if m:
                i += m.end()
                out.append("' '")
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return drop_inline_tests("".join(out))


def drop_inline_tests(code):
    """Unit tests are inline modules (`#[cfg(test)] mod tests { use super::*; ... }`): their
    `super` is the file itself, and what they import is not the module's design."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", code)
        if not m:
            return code
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        code = code[: m.start()] + code[i:]


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, s):
        i = s.find("{")
        if i < 0:
            for part in s.split(","):
                if part:
                    out.append(prefix + part)
            return
        head = s[:i]
        depth, j = 0, i
        for j in range(i, len(s)):
            if s[j] == "{":
                depth += 1
            elif s[j] == "}":
                depth -= 1
                if depth == 0:
                    break
        inner = s[i + 1 : j]
        # split inner at top-level commas
        parts, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        for p in parts:
            if p:
                walk(prefix + head, p)
        rest = s[j + 1 :].lstrip(",")
        if rest:
            walk(prefix, rest)

    walk("", tree)
    return out


def resolve(current, path):
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(current)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        # A bare path names a child module (`pub use child::Item`), or something external.
        base = list(current)
        if tuple(base + segs[:1]) not in files:
            return None
    best = tuple(base)
    for k in range(1, len(segs) + 1):
        cand = tuple(base + segs[:k])
        if cand in files:
            best = cand
    return best if best in files else None


USE = re.compile(r"\b(pub(?:\([\w:\s]+\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"(?<![\w:])\w+(?:::\w+)+")

texts = {}
for mod, path in files.items():
    with open(path, encoding="utf-8") as fh:
        texts[mod] = strip_comments(fh.read())

# A module's face: the names it hands on from elsewhere (`pub use child::Item`). A path through
# a face leads to where the name is defined, and handing a name on is not itself an edge.
faces = {}
for mod, text in texts.items():
    for m in USE.finditer(text):
        if not m.group(1):
            continue
        for p in expand_use(m.group(2)):
            target = resolve(mod, p)
            name = p.split("::")[-1]
            if target is not None and target != mod and name not in ("*", "self"):
                faces.setdefault(mod, {})[name] = target


def through_faces(target, name, seen=()):
    nxt = faces.get(target, {}).get(name)
    if nxt is None or nxt in seen:
        return target
    return through_faces(nxt, name, seen + (target,))


def add(mod, path):
    target = resolve(mod, path)
    if target is None:
        return
    name = path.split("::")[-1]
    target = through_faces(target, name)
    if target != mod:
        edges.setdefault(mod, {}).setdefault(target, set()).add(name)


edges = {}
for mod, text in texts.items():
    for m in USE.finditer(text):
        if m.group(1):
            continue
        for p in expand_use(m.group(2)):
            add(mod, p)
    for m in INLINE.finditer(USE.sub(";", text)):
        add(mod, m.group(0))

# Tarjan's strongly connected components.
index, low, stack, on, sccs = {}, {}, [], set(), []
counter = [0]
sys.setrecursionlimit(10000)


def connect(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges.get(v, {}):
        if w not in index:
            connect(w)
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
            sccs.append(comp)


for v in sorted(files):
    if v not in index:
        connect(v)


def name(mod):
    return os.path.relpath(files[mod], os.path.dirname(SRC))


if not sccs:
    print(f"check-cycles: {len(files)} modules, {sum(len(t) for t in edges.values())} edges, no cycle")
    sys.exit(0)
for comp in sccs:
    members = set(comp)
    print(f"cycle of {len(comp)} modules:", file=sys.stderr)
    for a in sorted(comp):
        for b, names in sorted(edges.get(a, {}).items()):
            if b in members:
                print(f"  {name(a)} -> {name(b)}: {', '.join(sorted(names))}", file=sys.stderr)
sys.exit(1)
