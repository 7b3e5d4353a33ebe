#!/usr/bin/env python3
"""Fails if files of a crate import each other, directly or around a loop.

Usage: .ci/module_cycles.py CRATE_SRC_DIR...
A file's imports are the `crate::` and `super::` paths in its code, outside comments and its
test module.
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super)::([a-z_0-9]+)(?:::([a-z_0-9]+))?")


def modules(root):
    """Module name -> the modules its code names."""
    mods = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)[:-3]
            name = rel.removesuffix("/mod").replace("/", "::")
            if name in ("lib", "main"):
                name = ""
            src = open(path).read().split("#[cfg(test)]\nmod tests")[0]
            code = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith("//"))
            parent = name.rsplit("::", 1)[0] if "::" in name else ""
            deps = set()
            for kind, a, b in PATH.findall(code):
                base = "" if kind == "crate" else parent
                dep = f"{base}::{a}" if base else a
                if b:
                    dep += f"::{b}"
                deps.add(dep)
            mods[name] = deps
    return mods


def cycles(mods):
    def known(d):
        while d not in mods and "::" in d:
            d = d.rsplit("::", 1)[0]
        return d if d in mods else None

    graph = {n: {known(d) for d in ds} - {None, n, ""} for n, ds in mods.items()}
    state, stack, found = {}, [], []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for n in sorted(graph):
        if not state.get(n):
            visit(n)
    return found


failed = False
for root in sys.argv[1:]:
    for c in cycles(modules(root)):
        print(f"{root}: import cycle: {' -> '.join(c)}")
        failed = True
sys.exit(1 if failed else 0)
