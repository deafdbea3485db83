"""The house's ground floor: ``app/core`` imports nothing of the project above it (read from the code's imports)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def project_imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every ``app.*`` module a file imports, at the top or inside a function, resolved to absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            found.add(base)
    return {name for name in found if name == "app" or name.startswith("app.")}


def reaching_up(root: Path) -> list[str]:
    return sorted(
        f"{path.relative_to(root)} imports {name}"
        for path in (root / "app" / "core").rglob("*.py")
        for name in project_imports(path, root)
        if not name.startswith("app.core")
    )


def test_the_core_imports_only_the_core() -> None:
    assert not reaching_up(ROOT), "app/core must not reach up:\n" + "\n".join(reaching_up(ROOT))


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    core = tmp_path / "app" / "core"
    core.mkdir(parents=True)
    (core / "late.py").write_text("def late():\n    from app.worker.cli import run_worker\n")
    (core / "relative.py").write_text("from ..webhooks import inbox\nfrom . import settings\n")
    assert reaching_up(tmp_path) == [
        "app/core/late.py imports app.worker.cli",
        "app/core/relative.py imports app.webhooks",
    ]
