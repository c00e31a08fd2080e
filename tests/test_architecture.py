"""The architecture holds: no import circles in daemon/, and the contracts in pyproject.toml
(layers, independent stages, the emulator apart) pass `lint-imports`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each set of two or more modules that import each other, directly or around a
    circle: a module with the modules it imports, at any depth, that import it back."""
    circles = set()
    for module in graph.modules:
        around = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if around:
            circles.add(frozenset({module, *around}))
    return sorted(sorted(circle) for circle in circles)


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No module in daemon/ imports, directly or through others, a module importing it."""
    graph = grimp.build_graph("daemon", cache_dir=None)
    circles = _circles(graph)
    shown = [
        " -> ".join(
            (graph.find_shortest_chain(first, second) or ())
            + (graph.find_shortest_chain(second, first) or ())[1:]
        )
        for first, second, *_ in circles
    ]
    assert circles == [], "\n".join(shown)


def test_the_contracts_hold() -> None:
    """`lint-imports` keeps every contract of pyproject.toml."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
