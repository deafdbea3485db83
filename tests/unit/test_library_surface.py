"""Libraries through their public interface only: checked from the imports, not by grepping text.

No module of the project imports a module or a name starting with ``_`` from an installed library
(``litestar.cli._utils``, ``arq.worker._...``): a private name may change in any release, silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = {"app", "bench", "tools", "tests", "__future__"}
SOURCES = [path for folder in ("app", "bench", "tools", "tests") for path in sorted((ROOT / folder).rglob("*.py"))]


def library_imports(tree: ast.AST) -> list[tuple[str, str]]:
    """``(module, name)`` of each absolute import of a library (``import x.y`` gives ``("x.y", "x.y")``)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and not _ours(node.module):
            names += [(node.module, alias.name) for alias in node.names]
        if isinstance(node, ast.Import):
            names += [(alias.name, alias.name) for alias in node.names if not _ours(alias.name)]
    return names


def _ours(module: str) -> bool:
    return module.split(".")[0] in PROJECT_PACKAGES


def _private(module: str, name: str) -> bool:
    return name.startswith("_") or any(part.startswith("_") for part in module.split("."))


def test_no_module_imports_a_private_module_or_name_of_a_library() -> None:
    private = [
        f"{path.relative_to(ROOT)}: from {module} import {name}"
        for path in SOURCES
        for module, name in library_imports(ast.parse(path.read_text()))
        if _private(module, name)
    ]
    assert private == [], "use the library's public interface (see its docs) instead"


def test_the_check_above_reads_the_imports_it_looks_for() -> None:
    """A private import written here is found: the check cannot pass by reading nothing."""
    tree = ast.parse("from litestar.cli._utils import LitestarGroup\nimport arq.worker\nfrom arq import _x\n")
    found = [(module, name) for module, name in library_imports(tree) if _private(module, name)]
    assert found == [("litestar.cli._utils", "LitestarGroup"), ("arq", "_x")]
    used = {module.split(".")[0] for path in SOURCES for module, _ in library_imports(ast.parse(path.read_text()))}
    assert {"arq", "litestar", "sqlalchemy", "click"} <= used
