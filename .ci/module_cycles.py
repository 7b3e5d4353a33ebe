#!/usr/bin/env python3
"""Fails if files of a crate import each other, directly or around a loop, or its folders do.

Usage: .ci/module_cycles.py [--level files|folders|both] CRATE_SRC_DIR...

Two checks run, both by default (`--level` picks one); a loop found by either fails.

Files. Each `.rs` file is a module: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs` and
`main.rs` are the root "". The root is left out of the cycles: it is the crate's facade (its
re-exports resolve to the modules below), and the home of crate-wide items such as a
`pub type SampleId` that every module names, so with it nearly every module would loop.

A file's imports are the paths in its code (`use` trees, and paths in expressions and types
such as `child::f()`), outside comments, string and char literals, and anything under
`#[cfg(test)]` (its `mod tests` block, and any file declared `#[cfg(test)] mod x;`). A path
counts when it starts with `crate::`, `super::` (repeatable), `self::`, or a name in the
module's scope: a child module (`mod child;`, inline `mod child { .. }`), a module-level
`use` import, or an item the module defines. A path starting with anything else (an extern
crate, std, a generic parameter) is not the crate's, so names no module.

Paths resolve through re-exports: `crate::pipeline::Layout`, where `pipeline/mod.rs` has
`pub(crate) use layout::Layout;`, names `pipeline::layout`, the file that defines `Layout`,
and `pipeline` as well, since the name is read through that file's imports (chains of `use`
are followed, private ones too since a child may name its parent's private imports). So
`holders -> pipeline -> pipeline::peers -> holders` is a cycle when `holders` names
`crate::pipeline::Layout` and `pipeline/mod.rs` re-exports from `peers`: name an item by the
file that defines it to depend on that file alone. A glob `use x::*` resolves a name through
`x` when `x` has it, and to `x` itself when nothing finds it. A name that resolves to nothing
(an item the parser missed, or one a macro makes) names the module the path reached; a `use`
of an extern crate's name names nothing. So a module's own use of its children is an edge
`m -> m::child`, a child's `super::Name` is an edge to the sibling the parent re-exports
`Name` from, and only a reference to an item defined in the parent's file is an edge to the
parent.

Folders. The same edges, with each file collapsed into the folder that holds it, one folder
at a time. A folder is a module with files below it: the root, `a/` (for `a/mod.rs`, or `a.rs`
beside `a/`), `a/b/`. Each folder D has a graph of its own. Its nodes are D's children: each
subfolder is one node, holding every file under it (its own `mod.rs` too), and each other
file in D is one node. D's own file (its `mod.rs`, `a.rs`, `lib.rs` or `main.rs`) is the
parent, not a node. Each edge of the file check, from file F to a file G its code names, is
an edge in one graph: that of the deepest folder holding both, from the child of it that
holds F to the child that holds G. So `a/x.rs` naming `crate::b::y::Y` is `a/ -> b/` in the
root's graph, and no edge inside `a/` or `b/`; `d/a/x.rs` naming `super::super::b::Y` (or
`crate::d::b::Y`, or `Y` after `use crate::d::{b::Y, c}`) is `a/ -> b/` in `d/`'s graph.
- The parent's uses of what is below it are no edge: the parent is the folder's facade, and
  puts its children together. Nor is a child's use of an item defined in the parent's own
  file: with the parent a node, each child that names it would loop with it. Loops between a
  parent and its children are the file check's to find (`m -> m::child -> m`).
- Re-exports are read as in the file check: a child's `super::Name` or `crate::d::Name`,
  where the parent re-exports `Name` from a sibling, is an edge to that sibling, the one that
  defines `Name` (and to any other sibling whose re-export of it the path passes through).

Prints `ROOT: import cycle: a -> b -> a` for each cycle between files, and for each cycle
between the children of a folder DIR, `DIR: folder import cycle: x/ -> y.rs -> x/` and then
one line per edge with the first use that makes it (`FILE:LINE names PATH`, and how many uses
there are), to show what to move. Exits 1 if any cycle was found, 0 otherwise.
"""
import argparse
import os
import sys

# A cfg(test) attribute's body is one of these, or `cfg(all(.., test, ..))`.
TEST_CFG = ["cfg", "(", "test", ")"]
# Keywords that start an item; the next word is its name unless in NOT_NAMES (`const fn f`,
# `static mut X`, `macro_rules! m` name the word after).
ITEM_KEYWORDS = {"fn", "struct", "enum", "union", "trait", "type", "const", "static", "macro_rules"}
NOT_NAMES = {"fn", "unsafe", "async", "extern", "mut", "_", "!"}


def is_ident(tok):
    return bool(tok) and (tok[0].isalpha() or tok[0] == "_")


def tokens(src, lines=None):
    """The identifiers and punctuation of Rust source, without comments and literals.

    `::` is one token; a lifetime or label is `'name`, so `'static` is not a keyword; strings,
    chars and numbers vanish, so what they contain is never taken for a path. With `lines`,
    the line number of each token is appended to it.
    """
    out, i, n = [], 0, len(src)
    at = [0, 1]  # a position in src, and its line: tokens come in order, so count onwards

    def emit(tok, start):
        out.append(tok)
        if lines is not None:
            at[1] += src.count("\n", at[0], start)
            at[0] = start
            lines.append(at[1])

    def skip_string(j):  # src[j] is the opening quote of a string with escapes
        j += 1
        while j < n and src[j] != '"':
            j += 2 if src[j] == "\\" else 1
        return j + 1

    def skip_raw(j):  # src[j] is `r`: r#*"..."#*
        j += 1
        hashes = 0
        while j < n and src[j] == "#":
            hashes, j = hashes + 1, j + 1
        end = '"' + "#" * hashes
        k = src.find(end, j + 1)
        return n if k < 0 else k + len(end)

    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            k = src.find("\n", i)
            i = n if k < 0 else k
        elif src.startswith("/*", i):
            depth, i = 1, i + 2  # block comments nest
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == '"':
            i = skip_string(i)
        elif c == "'":
            if i + 1 < n and src[i + 1] == "\\":
                k = i + 3  # past the escaped char, which may be a quote
                while k < n and src[k] != "'":
                    k += 1
                i = k + 1
            elif i + 2 < n and src[i + 2] == "'":
                i += 3
            else:  # a lifetime or a label
                k = i + 1
                while k < n and (src[k].isalnum() or src[k] == "_"):
                    k += 1
                emit(src[i:k], i)
                i = k
        elif c.isdigit():
            while i < n and (src[i].isalnum() or src[i] == "_"):
                i += 1
        elif c.isalpha() or c == "_":
            k = i
            while k < n and (src[k].isalnum() or src[k] == "_"):
                k += 1
            word = src[i:k]
            if word in ("r", "br", "cr") and k < n and src[k] in '"#':
                if src[k] == "#" and not (k + 1 < n and src[k + 1] in '"#'):
                    # r#ident: a raw identifier
                    k += 1
                    m = k
                    while m < n and (src[m].isalnum() or src[m] == "_"):
                        m += 1
                    emit(src[k:m], k)
                    i = m
                else:
                    i = skip_raw(k - 1)
            elif word in ("b", "c") and k < n and src[k] == '"':
                i = skip_string(k)
            elif word == "b" and k < n and src[k] == "'":
                m = k + 1
                if m < n and src[m] == "\\":
                    m += 1
                m += 1
                while m < n and src[m] != "'":
                    m += 1
                i = m + 1
            else:
                emit(word, i)
                i = k
        elif src.startswith("::", i):
            emit("::", i)
            i += 2
        else:
            emit(c, i)
            i += 1
    return out


class Scope:
    """What a (file or inline) module declares: its names, and the paths its code uses."""

    def __init__(self):
        self.children = set()  # child modules
        self.items = set()  # items it defines
        self.imports = {}  # name -> the `use` paths that bring it in
        self.globs = []  # paths of its `use x::*`


class Parser:
    """Reads one file into the scopes of its module and of its inline modules."""

    def __init__(self, crate, module, toks, lines=None):
        self.crate, self.toks, self.i = crate, toks, 0
        self.lines = lines or []  # the line of each token
        # (logical module, brace depth its items are at)
        self.stack = [(module, 0)]
        self.depth = 0
        self.file = module
        self.refs = crate.refs.setdefault(module, [])

    def line(self, j):
        return self.lines[j] if 0 <= j < len(self.lines) else 0

    def tok(self, k=0):
        j = self.i + k
        return self.toks[j] if 0 <= j < len(self.toks) else ""

    @property
    def module(self):
        return self.stack[-1][0]

    def at_item_level(self):
        return self.depth == self.stack[-1][1]

    def scope(self):
        return self.crate.scope(self.module)

    def parse(self):
        pending_mod = None  # an inline `mod name {` whose brace comes next
        while self.i < len(self.toks):
            t = self.tok()
            if t == "{":
                self.depth += 1
                if pending_mod:
                    self.stack.append((self.module + (pending_mod,), self.depth))
                    pending_mod = None
                self.i += 1
            elif t == "}":
                if len(self.stack) > 1 and self.stack[-1][1] == self.depth:
                    self.stack.pop()
                self.depth -= 1
                self.i += 1
            elif t == "#" and self.tok(1) == "!" and self.tok(2) == "[":
                self.i += 2
                if self.attribute_is_test() and len(self.stack) == 1:
                    self.crate.test_modules.add(self.file)  # #![cfg(test)]: all of it
            elif t == "#" and self.tok(1) == "[":
                self.i += 1
                if self.attribute_is_test():
                    self.skip_test_item()
            elif t == "mod" and is_ident(self.tok(1)):
                name = self.tok(1)
                if self.at_item_level():
                    self.scope().children.add(name)
                if self.tok(2) == "{":
                    pending_mod = name
                self.i += 2
            elif t == "use":
                self.i += 1
                self.use_declaration()
            elif t in ITEM_KEYWORDS and self.at_item_level():
                name = self.tok(1)
                if (t, name) in (("macro_rules", "!"), ("static", "mut")):
                    name = self.tok(2)
                if is_ident(name) and name not in NOT_NAMES:
                    self.scope().items.add(name)
                self.i += 1  # `const fn f`: the `fn` still names `f`
            elif is_ident(t) and self.tok(1) == "::" and self.tok(-1) != "::":
                self.path()
            else:
                self.i += 1

    def attribute_is_test(self):
        """Reads `[ .. ]` at self.i; whether it is `cfg(test)` or `cfg(all(.., test, ..))`."""
        depth, j = 0, self.i
        while j < len(self.toks):
            if self.toks[j] in "[(":
                depth += 1
            elif self.toks[j] in "])":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        body = self.toks[self.i + 1 : j]
        self.i = j + 1
        if body == TEST_CFG:
            return True
        return body[:4] == ["cfg", "(", "all", "("] and "test" in body and not (
            {"not", "any"} & set(body)
        )

    def skip_test_item(self):
        """Skips the item, statement, field or arm after a cfg(test) attribute."""
        top_level = self.at_item_level()
        while self.tok() == "#" and self.tok(1) == "[":  # its other attributes
            self.i += 1
            self.attribute_is_test()
        j = self.i
        while j < len(self.toks) and self.toks[j] in ("pub", "(", "crate", "super", "self", ")"):
            j += 1
        if self.toks[j : j + 1] == ["mod"] and j + 1 < len(self.toks) and len(self.stack) == 1:
            # A test-only file module: leave its file out.
            self.crate.test_children.add(self.module + (self.toks[j + 1],))
        depth = 0
        while self.i < len(self.toks):
            t = self.tok()
            self.i += 1
            if t in "([{":
                depth += 1
            elif t in ")]}":
                depth -= 1
                if depth < 0:  # the end of what holds it: leave that to the caller
                    self.i -= 1
                    return
                if depth == 0 and t == "}":
                    return
            elif depth == 0 and (t == ";" or (t == "," and not top_level)):
                return

    def path(self):
        """Records the path starting at self.i: `a::b::c`, ending before `::<` or a non-name."""
        segs = [self.tok()]
        start = self.i
        self.i += 1
        while self.tok() == "::" and is_ident(self.tok(1)):
            segs.append(self.tok(1))
            self.i += 2
        # `pub(in crate::a)` restricts visibility; it depends on nothing.
        if self.toks[max(start - 3, 0) : start] == ["pub", "(", "in"]:
            return
        self.refs.append((self.module, tuple(segs), self.line(start)))

    def use_declaration(self):
        """Records the leaves of the use tree at self.i, up to its `;`."""
        leaves = []

        def tree(prefix):
            segs = []
            if self.tok() == "::":
                self.i += 1
            while self.i < len(self.toks):
                t = self.tok()
                if t == "*":
                    self.i += 1
                    leaves.append((prefix + segs, "*", self.line(self.i - 1)))
                    return
                if t == "{":
                    self.i += 1
                    while self.tok() not in ("}", ""):
                        tree(prefix + segs)
                        if self.tok() == ",":
                            self.i += 1
                    self.i += 1
                    return
                if not is_ident(t):
                    return
                segs.append(t)
                self.i += 1
                if self.tok() == "::":
                    self.i += 1
                    continue
                path, line = prefix + segs, self.line(self.i - 1)
                if segs == ["self"] and prefix:  # `use a::{self}` names `a`
                    path = prefix
                name = path[-1]
                if self.tok() == "as":
                    name = self.tok(1)
                    self.i += 2
                leaves.append((path, name, line))
                return

        if self.tok() == "::":  # `use ::extern_crate::..`
            while self.tok() not in (";", ""):
                self.i += 1
            return
        tree([])
        while self.tok() not in (";", ""):
            self.i += 1
        scope = self.scope() if self.at_item_level() else None
        for path, name, line in leaves:
            if not path:
                continue
            self.refs.append((self.module, tuple(path), line))
            if scope is None:  # a `use` in a block names nothing for other modules
                continue
            if name == "*":
                scope.globs.append(tuple(path))
            elif name != "_" and name not in ("crate", "super", "self"):
                scope.imports.setdefault(name, []).append(tuple(path))


# What a path resolves to: a module, an item of a module, or nothing of this crate's.
MOD, ITEM, EXTERNAL = "mod", "item", "external"


class Crate:
    def __init__(self, root):
        self.scopes = {}  # logical module (a tuple of names) -> Scope
        self.refs = {}  # file module -> [(logical module the path is in, path, line)]
        self.files = set()
        self.paths = {}  # file module -> its file, relative to the crate's src
        self.test_children = set()  # modules declared `#[cfg(test)] mod x;`
        self.test_modules = set()  # files marked `#![cfg(test)]`
        for dirpath, dirs, names in os.walk(root):
            dirs.sort()
            for f in sorted(names):
                if f.endswith(".rs"):
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, root)
                    module = module_of(rel)
                    self.files.add(module)
                    self.paths[module] = rel
                    self.scope(module)
                    with open(path, encoding="utf-8", errors="replace") as src:
                        lines = []
                        toks = tokens(src.read(), lines)
                        Parser(self, module, toks, lines).parse()

    def scope(self, module):
        return self.scopes.setdefault(module, Scope())

    def is_test(self, module):
        return any(module[: len(t)] == t for t in self.test_children) or module in self.test_modules

    def lookup(self, module, name, seen, via=None):
        """What `name` in the scope of `module` is: (kind, module) or None if not there.
        Modules whose imports the answer passes through are added to `via`."""
        if (module, name) in seen:  # re-exports in a loop, such as globs both ways
            return None
        seen.add((module, name))
        scope = self.scopes.get(module)
        if scope is None:
            return None
        if name in scope.children or module + (name,) in self.files:  # declared or not
            return (MOD, module + (name,))
        if name in scope.items:
            return (ITEM, module)
        if name in scope.imports:  # two would be one name in two namespaces
            if via is not None:
                via.add(module)
            return self.resolve(module, scope.imports[name][0], seen, via)
        for path in scope.globs:
            kind, target = self.resolve(module, path, seen, via)
            if kind == MOD:
                found = self.lookup(target, name, seen, via)
                if found:
                    if via is not None:
                        via.add(module)
                    return found
        return None

    def resolve(self, module, path, seen=None, via=None):
        """What `path`, written in `module`, names: (kind, module); with `via`, the modules
        whose re-exports it passes through are added to it."""
        seen = set() if seen is None else seen
        head, k = path[0], 1
        if head == "crate":
            here = ()
        elif head == "self":
            here = module
        elif head == "super":
            here = module[:-1]
            while k < len(path) and path[k] == "super":
                here, k = here[:-1], k + 1
        else:
            found = self.lookup(module, head, seen, via)
            if found is None:
                return (EXTERNAL, None)
            kind, here = found
            if kind != MOD:
                return found
        for name in path[k:]:
            if here not in self.scopes:  # a module with no file here: the nearest has it
                return (MOD, here)
            found = self.lookup(here, name, seen, via)
            if found is None:
                # A glob's source is the best guess for a name nobody defines.
                globs = [self.resolve(here, g, seen) for g in self.scopes[here].globs]
                globs = [g for g in globs if g[0] == MOD]
                return globs[0] if globs else (ITEM, here)
            kind, here = found
            if kind != MOD:
                return found
        return (MOD, here)

    def file_of(self, module):
        """The file that holds a logical module: inline modules live in their parent's."""
        while module not in self.files and module:
            module = module[:-1]
        return module

    def checked(self):
        """The file modules the checks look at: all but the root and test-only files."""
        return sorted(m for m in self.files if m and not self.is_test(m))

    def uses(self):
        """(file module, file module it names, line, path) for each path in a checked file's
        code, and each other checked file the path names."""
        for module in self.checked():
            for where, path, line in self.refs.get(module, ()):
                via = set()
                kind, target = self.resolve(where, path, via=via)
                if kind == EXTERNAL:
                    continue
                # A name re-exported by another file is named through that file too: its
                # imports are part of what this one reads.
                for dep in sorted({self.file_of(target)} | {self.file_of(v) for v in via}):
                    if dep and dep != module and not self.is_test(dep):
                        yield module, dep, line, path

    def graph(self):
        """File module name -> the file modules its code names (the root excluded)."""
        graph = {name_of(m): set() for m in self.checked()}
        for module, dep, _, _ in self.uses():
            graph[name_of(module)].add(name_of(dep))
        return graph

    def folder_graphs(self):
        """Folder module -> the graph of its children: child -> child it names -> the uses
        that name it, [(file module, line, path)] in file and line order.

        A folder is any module with files below it (the root too); its children are the
        next names of the checked files below it: a file, or a folder with all under it.
        A use counts at the one folder where its two files part, and not at all when one
        file is the folder's own file (`mod.rs`) of a folder that holds the other.
        """
        folders = {}
        for module in self.checked():
            for k in range(len(module)):
                folders.setdefault(module[:k], {}).setdefault(module[k], {})
        for module, dep, line, path in self.uses():
            k = 0
            while k < min(len(module), len(dep)) and module[k] == dep[k]:
                k += 1
            if k == len(module) or k == len(dep):  # a folder's file and what is under it
                continue
            named = folders[module[:k]][module[k]]
            named.setdefault(dep[k], set()).add((module, line, path))
        for children in folders.values():
            for named in children.values():
                for b, found in named.items():
                    named[b] = sorted(found, key=lambda u: (self.paths[u[0]], u[1], u[2]))
        return folders

    def child_label(self, folder, child):
        """How a child of `folder` is shown: `name/` for a folder, else its file's name."""
        module = folder + (child,)
        if any(len(m) > len(module) and m[: len(module)] == module for m in self.checked()):
            return child + "/"
        return os.path.relpath(self.paths[module], os.path.join(*folder) if folder else ".")


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts = parts[:-1]
    return tuple(parts)


def name_of(module):
    return "::".join(module)


def cycles(graph):
    """The loops a depth-first walk finds, one for each edge back into its stack."""
    state, stack, found = {}, [], []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                found.append(stack[stack.index(v) :] + [v])
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for n in sorted(graph):
        if not state.get(n):
            visit(n)
    return found


def folder_cycles(crate, root):
    """The report of each loop between the children of a folder of the crate: a heading line,
    then one line per edge with the first use that makes it."""
    reports = []
    for folder, children in sorted(crate.folder_graphs().items()):
        for c in cycles(children):
            where = os.path.join(root, *folder)
            loop = " -> ".join(crate.child_label(folder, n) for n in c)
            lines = [f"{where}: folder import cycle: {loop}"]
            for a, b in zip(c, c[1:]):
                found = children[a][b]
                module, line, path = found[0]
                more = f" (1 of {len(found)} uses)" if len(found) > 1 else ""
                lines.append(
                    f"    {crate.child_label(folder, a)} -> {crate.child_label(folder, b)}: "
                    f"{os.path.join(root, crate.paths[module])}:{line} names "
                    f"{'::'.join(path)}{more}"
                )
            reports.append("\n".join(lines))
    return reports


def main(argv):
    parser = argparse.ArgumentParser(
        description="Fails if the files, or the folders, of a crate import each other."
    )
    parser.add_argument(
        "--level",
        choices=("files", "folders", "both"),
        default="both",
        help="which check to run (default: both)",
    )
    parser.add_argument("roots", nargs="+", metavar="CRATE_SRC_DIR")
    args = parser.parse_args(argv)
    for root in args.roots:
        if not os.path.isdir(root):
            parser.error(f"{root} is not a directory")
    failed = False
    for root in args.roots:
        crate = Crate(root)
        if args.level in ("files", "both"):
            for c in cycles(crate.graph()):
                print(f"{root}: import cycle: {' -> '.join(c)}")
                failed = True
        if args.level in ("folders", "both"):
            for report in folder_cycles(crate, root):
                print(report)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    sys.exit(main(sys.argv[1:]))
