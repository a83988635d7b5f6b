"""The import layers hold: imports point down (cli > flows > evaluation > retrieval > memory.stages >
memory core), no module imports itself back through others, retrieval reads the store without building
it, no stage imports another, no private name crosses modules, and no library code reads the
environment. Walks the source with `ast`, so it sees every import, top-level or inside a function."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memory", "retrieval", "evaluation", "flows")

#: the modules of the memory layer that orchestrate stages (above memory core, beside memory.stages)
ORCHESTRATION = ("memory.stages", "memory.pipeline", "memory.runs", "memory.forget", "memory.forget_plan",
                 "memory.forget_quarantine")
#: what the online retriever may import from memory: reading, never building (`memory.terms`: the
#: tokenizer the store's writes and the queries share)
RETRIEVAL_MAY_IMPORT = ("memory.store", "memory.schemas", "memory.ids", "memory.errors", "memory.embed",
                        "memory.read", "memory.settings", "memory.lexicon", "memory.terms")


def layer(module: str) -> int:
    """Higher layers may import lower ones, never the reverse."""
    if module == "flows.cli" or module.startswith("flows.cli."):
        return 5
    if module.startswith("flows"):
        return 4
    if module.startswith("evaluation"):
        return 3
    if module.startswith("retrieval"):
        return 2
    if any(module == m or module.startswith(m + ".") for m in ORCHESTRATION):
        return 1
    return 0


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(path)] = path
    return out


MODULES = sources()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _resolve(target: str) -> str | None:
    """The project module an import names (a module, or the package holding an imported name)."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


def imports(module: str) -> list[tuple[str, list[str], int]]:
    """(project module imported, names imported from it, line) for every import of `module`."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_lines(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (found := _resolve(alias.name)) is not None:
                    out.append((found, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:
                    out.append((sub, [], node.lineno))
                elif (found := _resolve(base)) is not None:
                    out.append((found, [alias.name], node.lineno))
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_the_walker_sees_the_packages() -> None:
    assert {"memory.store", "memory.stages", "retrieval.retriever", "flows.consolidate", "flows.cli",
            "evaluation"} <= set(MODULES)
    assert any(target == "memory.store" for target, _, _ in GRAPH["retrieval.retriever"])


def test_imports_point_down() -> None:
    upward = [f"{m}:{line} imports {target}" for m, edges in GRAPH.items() for target, _, line in edges
              if layer(target) > layer(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    """No module reaches itself through its imports (a package's `__init__` re-exporting its own
    submodules is not a cycle: the submodules never import the package back)."""
    edges = {m: {t for t, _, _ in GRAPH[m] if t != m} for m in MODULES}
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(MODULES, WHITE)
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        color[node] = GREY
        for nxt in sorted(edges[node]):
            if color[nxt] == GREY:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif color[nxt] == WHITE:
                visit(nxt, path + [nxt])
        color[node] = BLACK

    for m in sorted(MODULES):
        if color[m] == WHITE:
            visit(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_retrieval_reads_never_builds() -> None:
    bad = [f"{m}:{line} imports {target}" for m, edges in GRAPH.items() if m.startswith("retrieval")
           for target, _, line in edges
           if target.startswith("memory") and not any(target == a or target.startswith(a + ".")
                                                      for a in RETRIEVAL_MAY_IMPORT)]
    assert not bad, "\n".join(bad)


def test_no_stage_imports_another_stage() -> None:
    shared = {"memory.stages", "memory.stages.shard"}
    bad = [f"{m}:{line} imports {target}" for m, edges in GRAPH.items()
           if m.startswith("memory.stages.") and m not in shared
           for target, _, line in edges if target.startswith("memory.stages.") and target not in shared]
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules() -> None:
    bad = [f"{m}:{line} imports {name} from {target}" for m, edges in GRAPH.items()
           for target, names, line in edges if target != m
           for name in names if name.startswith("_") and not name.startswith("__")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("pkg", ["memory", "retrieval", "evaluation"])
def test_library_code_reads_no_environment(pkg: str) -> None:
    """Only `memory.settings.load_settings` reads `MNEMO_*`, called at the edges (flows, CLI)."""
    bad = []
    for m, path in MODULES.items():
        if not m.startswith(pkg) or m == "memory.settings":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Subscript)) else ""
            if text.startswith(("os.getenv(", "os.environ.get(", "os.environ[", "load_settings(")):
                bad.append(f"{m}:{node.lineno}: {text[:60]}")
    assert not bad, "\n".join(bad)


def test_no_module_over_the_size_limit() -> None:
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 420}
    assert not big, big


def _layout_rows() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_readme_layout_names_the_tree() -> None:
    """Every path the README's layout table names exists, and every module of the packages is named,
    itself or through its folder (a folder row lists the folder's modules it speaks of)."""
    import re

    rows = _layout_rows()
    named = {p for row in rows for p in re.findall(r"`([\w/]+(?:\.py)?/?)`", row.split(" | ")[0])}
    assert named, "no layout table in the README"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"the README names paths that do not exist: {missing}"
    text = "\n".join(rows)
    unnamed = []
    for path in MODULES.values():
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" or rel in named:
            continue
        folder = rel.rsplit("/", 1)[0] + "/"
        row = next((r for r in rows if f"`{folder}`" in r.split(" | ")[0]), None)
        listed = row is not None and (f"`{path.name}`" in row or f"`{path.stem}`" in row)
        if not listed and f"`{rel}`" not in text:
            unnamed.append(rel)
    assert not unnamed, f"modules the README's layout does not name: {unnamed}"
