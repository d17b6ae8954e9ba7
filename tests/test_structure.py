"""The package's structure: no import cycles between jaxcache's modules, and the one fact
Python must name before the extension loads agrees with the extension.

Every import counts, also those inside functions (a deferred import is still a cycle), but
not a module's dependence on its own package's __init__ (Python runs that first anyway).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jaxcache"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The jaxcache modules `path` imports (a `from package import name` of a submodule
    counts as that submodule)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    found.add(sub)
                elif target in modules:
                    found.add(target)
    # A module's own package (and its parents) run before it: not a dependency.
    return {m for m in found if m != name and not name.startswith(m + ".")}


def test_no_import_cycles():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports(p, modules) for p in paths}
    cycles, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_allocator_variable_is_the_settings_tables():
    """allocator.py names JAXCACHE_MALLOC_TUNING itself (it runs at `import jaxcache`,
    before the extension, hence the table, can load): the name must be the table's."""
    from jaxcache import allocator, protocol

    variables = [row for row in protocol.settings_table() if allocator.VARIABLE in row]
    assert variables, f"{allocator.VARIABLE} is not in xla_ext/config.h's JAXCACHE_SETTINGS"
