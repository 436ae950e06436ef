#!/usr/bin/env python3
"""Fails when two top-level modules of a crate import each other, directly or round a
longer cycle, in non-test code.

The graph: top-level module A (agent/src/A.rs or agent/src/A/...) depends on B when the
code of A names `crate::B` (in a `use`, a path, or a `deserialize_with = "crate::B::f"`
string) or climbs to the crate root with `super::` and names B from there. Comments and
`#[cfg(test)]` items (and the files such items declare) are skipped; `$crate` in macros is
not a module path.

    scripts/check-module-cycles.py [SRC_DIR]   (default agent/src)

Prints the edges with --edges. Exit status 1 when there is a cycle, listing each one.
"""

import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strip_comments(text):
    """The text with comments blanked out (strings and chars kept, newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not IDENT.match(text[i - 1:i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(text[i:end])
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a): keep either as is.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(m.group(0))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def skip_item(text, i):
    """The index just past the item starting at or after `i` (after its attributes)."""
    n = len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if text.startswith("#[", i):
            depth, i = 0, i + 1
            while i < n:
                if text[i] == "[":
                    depth += 1
                elif text[i] == "]":
                    depth -= 1
                    if depth == 0:
                        i += 1
                        break
                i += 1
            continue
        break
    depth = 0
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "({[":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return n


def test_items_removed(text):
    """`text` without `#[cfg(test)]` items; also the names of `mod x;` items removed."""
    out, removed = [], []
    i = 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        end = skip_item(text, m.end())
        decl = re.search(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text[m.end():end])
        if decl:
            removed.append(decl.group(1))
        out.append("\n" * text.count("\n", m.start(), end))
        i = end
    out.append(text[i:])
    return "".join(out), removed


def module_files(src):
    """(path, module path as a list of names) of every non-test file of the crate."""
    files = []

    def visit(path, modpath):
        text, test_mods = test_items_removed(strip_comments(open(path, encoding="utf-8").read()))
        files.append((path, modpath, text))
        base = os.path.dirname(path)
        stem = os.path.basename(path)[:-3]
        own_dir = base if stem in ("mod", "lib", "main") else os.path.join(base, stem)
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text, re.M):
            name = m.group(1)
            if name in test_mods:
                continue
            for candidate in (os.path.join(own_dir, name + ".rs"), os.path.join(own_dir, name, "mod.rs")):
                if os.path.exists(candidate):
                    visit(candidate, modpath + [name])
                    break

    visit(os.path.join(src, "lib.rs"), [])
    return files


def inline_mod_at(text):
    """Per character offset: the inline `mod x { }` names enclosing it."""
    spans = []
    for m in re.finditer(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{", text):
        end = skip_item(text, m.start())
        spans.append((m.start(), end, m.group(1)))
    return lambda pos: [name for (s, e, name) in spans if s < pos < e]


def group_names(text, i):
    """Top-level names of a `{a, b::c, self}` group starting at text[i] == '{'."""
    depth, names, j = 0, [], i
    token_start = True
    while j < len(text):
        c = text[j]
        if c == "{":
            depth += 1
            token_start = True
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        elif c == ",":
            token_start = depth == 1
        elif depth == 1 and token_start and not c.isspace():
            m = IDENT.match(text, j)
            if m:
                names.append(m.group(0))
                j = m.end() - 1
            token_start = False
        j += 1
    return names


def edges(src):
    graph = {}
    for path, modpath, text in module_files(src):
        if not modpath:
            continue
        top = modpath[0]
        deps = graph.setdefault(top, set())
        enclosing = inline_mod_at(text)
        for m in re.finditer(r"(?<![\w$])crate::(\{|[A-Za-z_][A-Za-z0-9_]*)", text):
            if m.group(1) == "{":
                deps.update(group_names(text, m.start(1)))
            else:
                deps.add(m.group(1))
        is_mod_file = os.path.basename(path) in ("mod.rs",) or len(modpath) == 1
        for m in re.finditer(r"(?<![\w$:])((?:super::)+)(\{|[A-Za-z_][A-Za-z0-9_]*)", text):
            ups = m.group(1).count("super::")
            # The module this code is in: the file's path plus inline modules around it.
            here = modpath + enclosing(m.start())
            if ups < len(here):
                continue  # stays inside the top-level module (or names a sibling in it)
            if ups == len(here):
                if m.group(2) == "{":
                    deps.update(group_names(text, m.start(2)))
                else:
                    deps.add(m.group(2))
        _ = is_mod_file
    tops = set(graph)
    return {a: {b for b in bs if b in tops and b != a} for a, bs in graph.items()}


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
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

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "agent", "src")
    graph = edges(src)
    if "--edges" in sys.argv:
        for a in sorted(graph):
            print(f"{a} -> {', '.join(sorted(graph[a])) or '-'}")
    found = cycles(graph)
    if not found:
        print(f"module cycles: none ({len(graph)} modules of {os.path.normpath(src)})")
        return 0
    print(f"module cycles in {os.path.normpath(src)} (non-test code):")
    for comp in found:
        pairs = sorted(f"{a}<->{b}" for a in comp for b in comp if a < b and b in graph[a] and a in graph[b])
        print(f"  {{{', '.join(comp)}}}" + (f": two-way {', '.join(pairs)}" if pairs else ""))
    return 1


if __name__ == "__main__":
    sys.exit(main())
