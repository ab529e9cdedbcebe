"""Imports point one way: every module's imports, read from its source, against the layer rules.

Layers, bottom up (docs/design.md, "Layers"):

- ``kernels`` imports nothing of the project;
- ``core``: ``kvstore`` (keys, block format, tier interfaces, DRAM tier, eviction, tier
  manager, wire layer) imports only the core;
- ``storage`` (``storage_nodes``) and ``clients`` import only the core;
- ``factory``: the one module that builds the embedded store (``kvstore.embedded``); an
  application-level module that the engine may call, so the core needs no ``storage_nodes``;
- ``replay`` (``bounded_replay``) imports the core and ``clients``; ``engine`` imports those,
  ``kernels`` and the factory, never the daemon or the SSD engine;
- ``daemon`` (``kvstore serve``): the core, ``storage_nodes`` and the factory; like the node
  server it speaks the core's wire layer, never the ``clients`` package;
- ``app``: the CLIs, ``hitrate``, ``loadgen``, the demo; may import any product layer;
- ``testing``: spawners and crash/fault backends; no product module imports them.

Besides the layers, no module may import a module that imports it back, directly or through
a chain (function-level imports count: they only delay the same dependency).

Today's violations sit in explicit allowlists below, each with why it is still there; fixing
one means deleting its line, and a stale entry fails the test so the lists only shrink.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("kvstore", "storage_nodes", "clients", "engine", "kernels", "bounded_replay")

# Longest dotted prefix wins.
LAYER_OF: Mapping[str, str] = {
    "kernels": "kernels",
    "kvstore": "core",
    "clients": "clients",
    "storage_nodes": "storage",
    "bounded_replay": "replay",
    "engine": "engine",
    "kvstore.embedded": "factory",
    # applications
    "kvstore.__main__": "app",
    "kvstore.cli": "app",
    "kvstore.daemon": "daemon",
    "kvstore.demo": "app",
    "kvstore.hitrate": "app",
    "kvstore.loadgen": "app",
    "clients.stats_cli": "app",
    # the vLLM connector: a client of the store that names blocks as the engine does
    "clients.vllm_connector": "app",
    "storage_nodes.node.cli": "app",
    "engine.cli": "app",
    "engine.entrypoints": "app",
    "engine.server": "app",
}
PRODUCT = frozenset(
    {"kernels", "core", "clients", "storage", "factory", "replay", "engine", "daemon", "app"}
)
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    "kernels": frozenset({"kernels"}),
    "core": frozenset({"core"}),
    "clients": frozenset({"core", "clients"}),
    "storage": frozenset({"core", "storage"}),
    "factory": frozenset({"core", "storage", "clients", "factory"}),
    "replay": frozenset({"core", "clients", "replay"}),
    "engine": frozenset({"core", "clients", "kernels", "replay", "factory", "engine"}),
    # The daemon is a server: it speaks the wire layer of the core, never the client package.
    "daemon": frozenset({"core", "storage", "factory", "daemon"}),
    "app": PRODUCT,
    "testing": PRODUCT | {"testing"},
}

# (importer, imported) pairs that break the layer rules today: none.
ALLOWED_LAYER_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()

# Import cycles (the modules of each strongly connected component) that exist today: none.
ALLOWED_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the given top-level packages."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(
    name: str, path: Path, modules: Mapping[str, Path], packages: tuple[str, ...] = PACKAGES
) -> Iterator[Import]:
    """Every project module `name` imports, at any depth of the file (lazy imports count).

    ``from pkg import sub`` where ``sub`` is a module is an import of ``pkg.sub``; a name that is
    not a module is an import of ``pkg`` itself, whose ``__init__`` then runs and counts.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, path.name == "__init__.py", node)
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # generated stubs (clients/proto/*_pb2*.py) are modules even before `make proto`
                is_module = sub in modules or alias.name.endswith(("_pb2", "_pb2_grpc"))
                targets.append(sub if is_module else base)
        else:
            continue
        for target in targets:
            if target.split(".")[0] in packages:
                yield Import(name, target, node.lineno)


def layer_of(module: str, table: Mapping[str, str] = LAYER_OF) -> str:
    parts = module.split(".")
    if "testing" in parts:  # kvstore.testing, storage_nodes.testing: scaffolding
        return "testing"
    for n in range(len(parts), 0, -1):
        layer = table.get(".".join(parts[:n]))
        if layer is not None:
            return layer
    raise KeyError(f"{module}: no layer; add its package to LAYER_OF")


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    modules = module_files(root, packages)
    return [
        imp for name, path in modules.items() for imp in imports_of(name, path, modules, packages)
    ]


def layer_violations(edges: list[Import]) -> dict[tuple[str, str], Import]:
    out: dict[tuple[str, str], Import] = {}
    for imp in edges:
        if layer_of(imp.imported) not in MAY_IMPORT[layer_of(imp.importer)]:
            out.setdefault((imp.importer, imp.imported), imp)
    return out


def cycles(edges: list[Import]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for imp in edges:
        if imp.importer != imp.imported:
            graph.setdefault(imp.importer, set()).add(imp.imported)
            graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


# ---------------------------------------------------------------------------- the real tree


@pytest.fixture(scope="module")
def edges() -> list[Import]:
    return import_graph(REPO)


def test_every_module_has_a_layer() -> None:
    for name in module_files(REPO):
        layer_of(name)


def test_imports_point_down(edges: list[Import]) -> None:
    found = layer_violations(edges)
    new = sorted(set(found) - ALLOWED_LAYER_VIOLATIONS)
    assert not new, "imports against the layers:\n" + "\n".join(
        f"  {found[k].importer} ({layer_of(k[0])}) line {found[k].line} -> "
        f"{k[1]} ({layer_of(k[1])})"
        for k in new
    )
    stale = sorted(ALLOWED_LAYER_VIOLATIONS - set(found))
    assert not stale, f"fixed, so delete from ALLOWED_LAYER_VIOLATIONS: {stale}"


def test_no_import_cycles(edges: list[Import]) -> None:
    found = cycles(edges)
    new = found - ALLOWED_CYCLES
    assert not new, "import cycles:\n" + "\n".join(f"  {sorted(c)}" for c in new)
    stale = ALLOWED_CYCLES - found
    assert not stale, f"gone, so delete from ALLOWED_CYCLES: {[sorted(c) for c in stale]}"


# ------------------------------------------------------------------- the checker can fail


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for pkg in PACKAGES:
        (root / pkg).mkdir(exist_ok=True)
        (root / pkg / "__init__.py").touch()
    return root


def test_a_forbidden_import_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "kvstore/keys.py": "import hashlib\n",
            "kvstore/tier.py": "from kvstore.keys import Key\n",
            "clients/core.py": "from kvstore import tier\n",
            # the core reaching up into a client, inside a function: still an import
            "kvstore/manager.py": "def f():\n    from clients.core import X\n",
            "engine/run.py": "from storage_nodes.ssd import tier\n",
            "storage_nodes/ssd/__init__.py": "",
            "storage_nodes/ssd/tier.py": "from ..ssd import __name__\n",
            "kernels/api.py": "import engine.run\n",
            "storage_nodes/node/server.py": "from kvstore.daemon.runner import run\n",
            "kvstore/daemon/runner.py": "",
        },
    )
    found = layer_violations(import_graph(root))
    assert set(found) == {
        ("kvstore.manager", "clients.core"),
        ("engine.run", "storage_nodes.ssd.tier"),
        ("kernels.api", "engine.run"),
        ("storage_nodes.node.server", "kvstore.daemon.runner"),
    }
    assert found[("kvstore.manager", "clients.core")].line == 2


def test_a_product_import_of_test_scaffolding_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "storage_nodes/ssd/tier.py": "from storage_nodes.testing.ssd_backends import Crash\n",
            "storage_nodes/testing/__init__.py": "",
            "storage_nodes/testing/ssd_backends.py": "from storage_nodes.ssd.tier import T\n",
        },
    )
    edges = import_graph(root)
    assert set(layer_violations(edges)) == {
        ("storage_nodes.ssd.tier", "storage_nodes.testing.ssd_backends")
    }


def test_a_cycle_is_reported_directly_through_a_package_and_lazily(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            # direct
            "kvstore/a.py": "from kvstore.b import x\n",
            "kvstore/b.py": "import kvstore.a\n",
            # through a package: clients/__init__ re-exports what imports clients back
            "clients/__init__.py": "from clients.sync import Client\n",
            "clients/sync.py": "from clients.errors import E\n",
            "clients/errors.py": "import clients\n",
            # lazily, three long
            "engine/x.py": "def f():\n    from engine import y\n",
            "engine/y.py": "from .z import q\n",
            "engine/z.py": "def g():\n    import engine.x\n",
            # not a cycle: two modules importing one third
            "kernels/p.py": "from kernels.r import z\n",
            "kernels/q.py": "from kernels.r import z\n",
            "kernels/r.py": "",
        },
    )
    assert cycles(import_graph(root)) == {
        frozenset({"kvstore.a", "kvstore.b"}),
        frozenset({"clients", "clients.sync", "clients.errors"}),
        frozenset({"engine.x", "engine.y", "engine.z"}),
    }


def test_the_real_tree_is_read(edges: list[Import]) -> None:
    # Guards the checker against reading nothing: these imports exist and must be seen.
    pairs = {(e.importer, e.imported) for e in edges}
    assert ("engine.connector.stores", "kvstore.embedded") in pairs
    assert ("kvstore.embedded", "storage_nodes.ssd") in pairs or any(
        a == "kvstore.embedded" and b.startswith("storage_nodes.ssd") for a, b in pairs
    )
