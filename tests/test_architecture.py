"""The tree says the design: imports flow down the floors of docs/architecture.md, with no circle,
and no source file outgrows one concept."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

# floor of each top-level part of the package, lowest first; an import may only reach the same floor
# or a lower one (docs/architecture.md draws the same floors)
FLOORS: dict[str, int] = {
    # ground: what everything stands on
    "cbsim.conf": 0,
    "cbsim.config": 0,
    "cbsim.trace": 0,
    "cbsim.kv_blocks": 0,
    "cbsim.rundir": 0,
    "cbsim.interrupts": 0,
    "cbsim.host": 0,
    # requests and what a step costs
    "cbsim.workload": 1,
    "cbsim.costs": 1,
    "cbsim.scheduler": 2,
    "cbsim.run_setup": 3,
    # the two back ends, side by side
    "cbsim.sim": 4,
    "cbsim.runtime": 4,
    "cbsim.metrics": 5,
    "cbsim.bands": 6,
    "cbsim.widening": 6,
    "cbsim.job_metrics": 6,
    "cbsim.sizing": 6,
    "cbsim.report": 6,
    "cbsim.calibration": 7,
    "cbsim.validation": 7,
    # entry points
    "cbsim.api": 8,
    "cbsim.app": 8,
    "cbsim.preflight": 8,
    "cbsim.sweep": 8,
    "cbsim.capacity": 8,
    "cbsim.profiling": 8,
    "cbsim": 9,
}
SOURCE_ROOTS = {"cbsim": REPO / "cbsim", "cbsim.runtime": REPO / "runtime"}
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for name, root in SOURCE_ROOTS.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((name, *parts))] = path
    return out


def _floor(module: str) -> int | None:
    best = None
    for prefix in FLOORS:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return FLOORS[best] if best else None


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("cbsim")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("cbsim"):
                found |= {f"{target}.{a.name}" for a in node.names} | {target}
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    graph = {}
    for m, p in mods.items():
        targets = _imports(m, p)
        # `from pkg import module` names the module, not the package's __init__
        named = {t for t in targets if t in mods}
        bare = {
            t for t in targets if t not in mods and not any(n.startswith(t + ".") for n in named)
        }
        graph[m] = {r for t in named | bare if (r := resolve(t)) and r != m}
    return graph


def test_no_import_reaches_a_higher_floor():
    upward = []
    for module, targets in _graph().items():
        if module == "cbsim" or module.endswith("__main__"):
            continue
        here = _floor(module)
        for target in targets:
            there = _floor(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{module} (floor {here}) imports {target} (floor {there})")
    assert upward == []


def test_no_import_circle():
    graph = _graph()
    # package __init__ files re-export their own modules; a circle through one is still a circle
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own modules
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


@pytest.mark.parametrize("root", ["cbsim", "runtime", "tests"])
def test_no_source_file_over_the_limit(root):
    long = {
        str(p.relative_to(REPO)): n
        for p in (REPO / root).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
