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


def imports_pipelines(path: Path) -> list[int]:
    """Lines of a perceptual module that import perceptual.pipelines (absolute, or relative from perceptual/)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            lines += [node.lineno for alias in node.names if alias.name.startswith("perceptual.pipelines")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            absolute = node.level == 0 and module.startswith("perceptual.pipelines")
            relative = node.level == 1 and (module.startswith("pipelines") or (not module and any(a.name == "pipelines" for a in node.names)))
            lines += [node.lineno] if absolute or relative else []
    return lines


def test_the_library_floor_of_perceptual_never_imports_its_commands():
    """perceptual.pipelines (the commands) sits above perceptual; only the entry point, perceptual/__main__.py, reads it."""
    modules = [m for m in sorted((ROOT / "perceptual").rglob("*.py")) if "pipelines" not in m.parts and m.name != "__main__.py"]
    violations = [f"{m.relative_to(ROOT)}:{line}" for m in modules for line in imports_pipelines(m)]
    assert not violations, "perceptual modules importing perceptual.pipelines:\n" + "\n".join(violations)
    assert imports_pipelines(ROOT / "perceptual" / "__main__.py")  # the checker sees the one import there is


def test_the_checker_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from perceptual.observers import Panel\n    import stimuli.sets as s\n")
    assert [name for _, name in imported_packages(module)] == ["os", "perceptual", "stimuli"]
