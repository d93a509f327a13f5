"""The import graph of bert_jax: no module imports itself back, the data package imports in one direction, and
data preparation and the GLUE job start without the heavy libraries they do not run.

The graph is read from the source with `ast` (nothing is imported): an edge a -> b for every `import
bert_jax.b`, `from bert_jax import b`, `from bert_jax.x import b` (b a module, else its package) and
relative import in module a, at module level or inside a function, class or branch alike (an import
placed inside a function still runs, so it closes a circle just as a module-level one does), but for
those under `if __name__ == "__main__":` (`_nodes`). `import bert_jax.x.y` also runs the package
bert_jax.x first; that edge is left out (bert_jax's package __init__ files import none of their modules
but kernels/__init__.py, whose own imports are read like any module's).
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The pre-training data package's layers, bottom first: a module may import its own layer's modules
# (acyclically) and the layers below, never one above.
DATA_LAYERS = (
    ("formats", "token_store"),  # metadata.json, format versions and kinds, shard opening; the token store
    ("document_shards", "procedure"),  # tokenized documents; the original's instances
    ("holdout", "stream", "packing", "dynamic", "beam_pipeline"),  # held-out split, global order, packing,
    # drawing while reading; preparation on Beam
    ("loader",),  # the grain input pipelines
)

# The package's rooms, bottom first: a room imports its own modules and the rooms below, never one above. The
# entry points (`python -m bert_jax.train`, ...) run their room's module with runpy and import nothing.
ROOMS = (
    ("errors", "storage", "console"),  # one-line errors, paths and URIs, the command line's stderr
    ("model", "data"),  # the model and its kernels; corpora, tokenization, task files, pre-training data
    ("configs", "checkpoints"),  # the recipes; checkpoints and weight formats
    ("training",),  # step machinery, loop, pre-training
    ("tasks",),  # fine-tuning jobs, feature extraction
    ("experiments",),  # the demo, transfer experiments
    ("train", "aot", "convert", "demo", "extract_features"),  # entry points
)


def _module_names(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """Module name -> its file, for every module under root/bert_jax/."""
    names = {}
    for path in sorted((root / "bert_jax").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__" and isinstance(node.test.comparators[0], ast.Constant)
            and node.test.comparators[0].value == "__main__")


def _nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node of a module but those under its `if __name__ == "__main__":` blocks: they run only when
    the file runs as __main__, and what they import then imports this file anew under its own name (a
    fresh module, not a half-initialised one), so they close no circle."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(child for child in ast.iter_child_nodes(node) if not _is_main_guard(child))


def _import_edges(modules: dict[str, pathlib.Path], root: pathlib.Path = ROOT) -> dict[str, dict[str, str]]:
    """Module -> {bert_jax module it imports: "file:line" of the first such import}."""
    edges: dict[str, dict[str, str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: dict[str, int] = {}
        for node in _nodes(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package, one level up per extra dot
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from x import y`: the module x.y when there is one, else a name defined in x.
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import bert_jax.data.x.y` of a name: its module
                    target = target.rpartition(".")[0]
                if target:
                    found[target] = min(found.get(target, node.lineno), node.lineno)
        edges[name] = {target: f"{path.relative_to(root)}:{line}" for target, line in sorted(found.items())}
    return edges


def _components(edges: dict[str, dict[str, str]]) -> list[tuple[str, ...]]:
    """The import cycles' modules: each strongly connected component of more than one module (or a module
    importing itself), sorted, found by Tarjan's algorithm; in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[tuple[str, ...]] = []

    def visit(v: str) -> None:  # recursion depth <= number of modules (about 70)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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
            if len(component) > 1 or v in edges.get(v, ()):
                components.append(tuple(sorted(component)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(components)


def _cycle_in(component: tuple[str, ...], edges: dict[str, dict[str, str]]) -> list[str]:
    """A shortest cycle through the component's first module, within the component (breadth first)."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle in component {component}")


def _describe(component: tuple[str, ...], edges: dict[str, dict[str, str]]) -> str:
    """'{a, b, c}, e.g. a -> b (bert_jax/a.py:12) -> a (bert_jax/b.py:3)': the component's modules and one
    cycle through them, each step with the import that makes it."""
    cycle = _cycle_in(component, edges)
    steps = " -> ".join([cycle[0]] + [f"{b} ({edges[a][b]})" for a, b in zip(cycle, cycle[1:])])
    return f"{{{', '.join(component)}}}, e.g. {steps}"


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, str]]:
    return _import_edges(_module_names())


def test_graph_reader_sees_every_kind_of_import(tmp_path):
    """The reader finds module-level, function-level, `from package import module`, `from module import
    name` and relative imports and skips a `__main__` block; the cycle finder names a cycle through all of
    them, and finds none once one import is gone."""
    package = tmp_path / "bert_jax"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("import os\nfrom bert_jax import b\n")
    (package / "b.py").write_text("def f():\n    from bert_jax.sub import c\n")
    (package / "sub" / "c.py").write_text("from .d import VALUE\n")
    (package / "sub" / "d.py").write_text("import bert_jax.a\nVALUE = 1\n")
    (package / "sub" / "e.py").write_text("from bert_jax.sub.d import VALUE\nfrom bert_jax import sub\n"
                                          "if __name__ == '__main__':\n    from bert_jax.sub import e\n")
    edges = _import_edges(_module_names(tmp_path), tmp_path)
    assert edges["bert_jax.a"] == {"bert_jax.b": "bert_jax/a.py:2"}
    assert edges["bert_jax.b"] == {"bert_jax.sub.c": "bert_jax/b.py:2"}
    assert edges["bert_jax.sub.c"] == {"bert_jax.sub.d": "bert_jax/sub/c.py:1"}
    assert edges["bert_jax.sub.d"] == {"bert_jax.a": "bert_jax/sub/d.py:1"}
    assert edges["bert_jax.sub.e"] == {"bert_jax.sub.d": "bert_jax/sub/e.py:1", "bert_jax.sub": "bert_jax/sub/e.py:2"}
    components = _components(edges)
    assert components == [("bert_jax.a", "bert_jax.b", "bert_jax.sub.c", "bert_jax.sub.d")]
    assert _describe(components[0], edges) == (
        "{bert_jax.a, bert_jax.b, bert_jax.sub.c, bert_jax.sub.d}, e.g. bert_jax.a -> bert_jax.b (bert_jax/a.py:2) "
        "-> bert_jax.sub.c (bert_jax/b.py:2) -> bert_jax.sub.d (bert_jax/sub/c.py:1) "
        "-> bert_jax.a (bert_jax/sub/d.py:1)")
    assert _components(edges | {"bert_jax.sub.d": {}}) == []


def test_no_import_cycles(graph):
    """No import cycle inside bert_jax/: no module imports itself back, directly or through others."""
    cycles = _components(graph)
    assert not cycles, "import cycles in bert_jax/:\n" + "\n".join(_describe(c, graph) for c in cycles)


def test_data_package_imports_downwards(graph):
    """A pre-training data module imports only its own layer and those below it (DATA_LAYERS)."""
    layer = {f"bert_jax.data.pretraining.{m}": i for i, modules in enumerate(DATA_LAYERS) for m in modules}
    assert set(layer) <= set(graph), f"DATA_LAYERS names modules that do not exist: {set(layer) - set(graph)}"
    upward = [f"{a} (layer {layer[a]}) imports {b} (layer {layer[b]}) at {where}"
              for a in sorted(layer) for b, where in sorted(graph[a].items()) if layer.get(b, -1) > layer[a]]
    assert not upward, "imports against the data package's layering:\n" + "\n".join(upward)



def _room(module: str) -> str:
    """bert_jax.training.steps -> training; bert_jax.train -> train; bert_jax -> '' (the package's lazy API)."""
    return module.split(".")[1] if "." in module else ""


def test_rooms_import_downwards(graph):
    """Every module's room (its first name under bert_jax) is in ROOMS, and imports only its own room and the
    rooms below it: the model knows nothing of training, training nothing of the tasks."""
    layer = {room: i for i, rooms in enumerate(ROOMS) for room in rooms}
    unplaced = sorted({_room(m) for m in graph} - set(layer) - {""})
    assert not unplaced, f"rooms missing from ROOMS: {unplaced}"
    upward = [f"{a} ({_room(a)}, layer {layer[_room(a)]}) imports {b} ({_room(b)}, layer {layer[_room(b)]}) at {where}"
              for a in sorted(graph) if _room(a) for b, where in sorted(graph[a].items())
              if _room(b) and layer[_room(b)] > layer[_room(a)]]
    assert not upward, "imports against the rooms' order:\n" + "\n".join(upward)


def test_rooms_are_small():
    """At most 12 modules and 8 subpackages at any one level of the package (issue 51's layout rule)."""
    crowded = {}
    for package in [ROOT / "bert_jax", *(p.parent for p in (ROOT / "bert_jax").rglob("__init__.py"))]:
        modules = [p for p in package.glob("*.py") if p.name != "__init__.py"]
        packages = [p for p in package.iterdir() if (p / "__init__.py").is_file()]
        if len(modules) > 12 or len(packages) > 8:
            crowded[str(package.relative_to(ROOT))] = (len(modules), len(packages))
    assert not crowded, f"packages with more than 12 modules or 8 subpackages (modules, subpackages): {crowded}"


def test_workspace_map_is_true_to_the_files():
    """WORKSPACE.md's layout rows name every module of bert_jax/ and only files that exist (a row's first cell:
    `bert_jax/a/b.py`, then bare names in the same folder, `c.py`)."""
    named = set()
    for line in (ROOT / "WORKSPACE.md").read_text().splitlines():
        if not line.startswith("| `bert_jax/"):
            continue
        folder = None
        for item in re.findall(r"`([^`]+)`", line.split("|")[1]):
            path = item if item.startswith("bert_jax/") else f"{folder}/{item}"
            folder = path.rstrip("/").rpartition("/")[0] if path.endswith(".py") else path.rstrip("/")
            named.add(path.rstrip("/"))
    missing = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bert_jax").rglob("*.py")
                     if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in named
                     and str(p.parent.relative_to(ROOT)) not in named)
    stale = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing and not stale, f"modules without a WORKSPACE.md row: {missing}; rows naming no file: {stale}"


def documented_commands() -> list[str]:
    """Every `python -m bert_jax...` module named in README.md, docs/, launch/ and the Makefile."""
    texts = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md"), *(ROOT / "launch").iterdir()]
    found = set()
    for path in texts:
        found.update(re.findall(r"python3? -m (bert_jax(?:\.[a-z_]+)*)", path.read_text()))
    return sorted(found)


def test_documented_commands_start():
    """Each documented command starts in a fresh interpreter: `--help` prints its usage (absl exits 1 after
    help, argparse 0) with no traceback, so a moved module or an entry point that lost its target fails here."""
    import concurrent.futures
    import subprocess
    import sys

    commands = documented_commands()
    assert {"bert_jax.train", "bert_jax.convert", "bert_jax.aot", "bert_jax.demo", "bert_jax.extract_features",
            "bert_jax.data.create_pretraining_data", "bert_jax.tasks.squad"} <= set(commands), commands

    def start(module):
        return module, subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True,
                                      text=True, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(start, commands))
    failed = [f"{module}: exit {r.returncode}: {r.stderr[-800:]}" for module, r in results
              if r.returncode not in (0, 1) or "Traceback" in r.stderr or not r.stdout.strip()]
    assert not failed, "\n".join(failed)


def test_commands_start_without_what_they_do_not_run():
    """Data preparation (its command and Beam workers) starts without jax, flax, orbax or grain, and a GLUE job
    without scipy and sklearn (its evaluation imports them), so that they start (and answer a bad flag)
    quickly. Imported for real, in a fresh interpreter."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "import bert_jax.data.create_pretraining_data, bert_jax.data.vocab, bert_jax.data.pretraining.beam_pipeline\n"
             "print(sorted(m for m in ('jax', 'flax', 'orbax', 'grain') if m in sys.modules))\n"
             "import bert_jax.tasks.glue\n"
             "print(sorted(m for m in ('scipy', 'sklearn') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:2] == ["[]", "[]"], result.stdout
