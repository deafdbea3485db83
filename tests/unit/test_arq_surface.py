"""arq through its public interface only: checked from the imports and class definitions, not by grepping text.

No module of the project imports a name starting with ``_`` from ``arq``, and no
class derives from ``arq.Worker`` to replace a method whose name starts with
``_`` (arq is in maintenance mode: a private name may change in any release).
The one module allowed to write arq's keys, ``app/queue/arq_adapter.py``, has
its own contract test.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import arq.worker

import app

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [path for folder in ("app", "bench", "tools", "tests") for path in sorted((ROOT / folder).rglob("*.py"))]


def _arq_imports(tree: ast.AST) -> list[tuple[str, str]]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "arq":
            names += [(node.module, alias.name) for alias in node.names]
        if isinstance(node, ast.Import):
            names += [(alias.name, alias.name) for alias in node.names if alias.name.split(".")[0] == "arq"]
    return names


def test_no_module_imports_a_private_name_from_arq() -> None:
    private = [
        f"{path.relative_to(ROOT)}: from {module} import {name}"
        for path in SOURCES
        for module, name in _arq_imports(ast.parse(path.read_text()))
        if name.startswith("_") or any(part.startswith("_") for part in module.split("."))
    ]
    assert private == []


def test_the_project_does_use_arq_so_the_check_above_reads_something() -> None:
    used = {name for path in SOURCES for _, name in _arq_imports(ast.parse(path.read_text()))}
    assert {"Worker", "func", "Retry"} <= used


def test_no_class_replaces_a_private_method_of_arqs_worker() -> None:
    for module in pkgutil.walk_packages(app.__path__, "app."):
        if not module.name.endswith("__main__"):  # an entry point runs when imported
            importlib.import_module(module.name)
    workers = [cls for cls in _subclasses(arq.worker.Worker) if cls.__module__.startswith(("app.", "bench."))]
    overridden = [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for cls in workers
        for name, value in vars(cls).items()
        if name.startswith("_") and not name.startswith("__") and inspect.isfunction(value)
    ]
    assert overridden == []


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found
