"""The floors import one way (../shared/DESIGN.md): every import statement of every module, those inside
functions included, read from the source with ``ast``.

    perceptual.pipelines → perceptual → stimuli → training → invert
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> the packages of this project it must never import
FORBIDDEN = {
    "invert": {"training", "stimuli", "perceptual", "conf"},
    "training": {"stimuli", "perceptual"},
    "stimuli": {"perceptual"},
}


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in a module, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_floors_never_import_higher_ones(package):
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, f"no modules found under {package}/"
    violations = [
        f"{module.relative_to(ROOT)}:{line} imports {name}"
        for module in modules
        for line, name in imported_packages(module)
        if name in FORBIDDEN[package]
    ]
    assert not violations, "imports against the floor order:\n" + "\n".join(violations)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from perceptual.observers import Panel\n    import stimuli.sets as s\n")
    assert [name for _, name in imported_packages(module)] == ["os", "perceptual", "stimuli"]
