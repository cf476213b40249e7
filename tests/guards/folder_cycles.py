#!/usr/bin/env python3
"""Folder include graph of include/qcoll/, and its cycles (issue 13).

Every directory under include/qcoll/ is a node (subfolders too: kernels/cpu and
kernels/cpu/simd are two nodes); the root folder is the node `qcoll`. An edge A -> B
means a header in A includes a header in B with #include <qcoll/...>. Includes inside
#if branches count too: the graph is what a reader of the sources sees.

Prints the graph (one `folder -> folder, ...` line per node; --dot for Graphviz),
then fails (exit 1) naming every cycle, with the includes that make each edge, and
every file in a subfolder that includes a root-level header (the root holds entry
headers for users; nothing inside the library may depend on them).

Usage: folder_cycles.py [--dot] <include dir>   (the directory that holds qcoll/)
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](qcoll/[^>"]+)[>"]')
SUFFIXES = {".hpp", ".h", ".cuh", ".ipp"}


def folder_of(path: str) -> str:
    return path.rsplit("/", 1)[0]  # "qcoll/kernels/cpu/x.hpp" -> "qcoll/kernels/cpu"


def read_graph(include_dir: pathlib.Path):
    """edges[a][b] = [(including file, included file), ...]; nodes = every folder."""
    root = include_dir / "qcoll"
    nodes, edges = set(), {}
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            nodes.add(path.relative_to(include_dir).as_posix())
        if not path.is_file() or path.suffix not in SUFFIXES:
            continue
        name = path.relative_to(include_dir).as_posix()
        source = folder_of(name)
        nodes.add(source)
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            match = INCLUDE.match(line)
            if not match:
                continue
            target = folder_of(match.group(1))
            nodes.add(target)
            if target != source:
                edges.setdefault(source, {}).setdefault(target, []).append((name, match.group(1)))
    return sorted(nodes), edges


def strongly_connected(nodes, edges):
    """Tarjan's algorithm; returns the components with more than one folder."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return found


def a_cycle(start, component, edges):
    """A shortest cycle from `start` back to it inside the component (breadth-first)."""
    members = set(component)
    previous, frontier = {start: None}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges.get(v, {})):
                if w == start:
                    path = [v]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if w in members and w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    return component


def main(argv):
    dot = "--dot" in argv
    args = [a for a in argv if a != "--dot"]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    nodes, edges = read_graph(pathlib.Path(args[0]))

    if dot:
        print("digraph qcoll_folders {")
        for v in nodes:
            for w in sorted(edges.get(v, {})):
                print(f'  "{v}" -> "{w}";')
        print("}")
    else:
        print(f"folder include graph of include/qcoll/ ({len(nodes)} folders):")
        for v in nodes:
            print(f"  {v} -> {', '.join(sorted(edges.get(v, {}))) or '(nothing of qcoll)'}")

    failures = 0
    for v in nodes:
        if v != "qcoll" and "qcoll" in edges.get(v, {}):
            for including, included in edges[v]["qcoll"]:
                print(f"ROOT: {including} includes the root-level entry header {included}")
                failures += 1
    for component in strongly_connected(nodes, edges):
        print(f"CYCLE among {{{', '.join(component)}}}:")
        covered = set()
        for start in component:  # a shortest cycle through each folder not yet shown in one
            if start in covered:
                continue
            cycle = a_cycle(start, component, edges)
            covered.update(cycle)
            print(f"  {' -> '.join(cycle)}")
            for a, b in zip(cycle, cycle[1:]):
                including, included = edges[a][b][0]
                more = len(edges[a][b]) - 1
                print(f"    {a} -> {b}: {including} includes {included}" + (f" (+{more} more)" if more else ""))
        failures += 1
    if failures:
        print(f"FAILED: {failures} problem(s); the folder graph of include/qcoll/ must be acyclic, and no subfolder may include a root-level header")
        return 1
    print("OK: the folder graph is acyclic and no subfolder includes a root-level header")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
