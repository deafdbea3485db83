"""arq through its public interface only: checked from the imports and class definitions, not by grepping text.

No class derives from ``arq.Worker`` to replace a method whose name starts with
``_`` (arq is in maintenance mode: a private name may change in any release),
and no module imports a private name of arq (``test_library_surface``: of any
library).
The one module allowed to write arq's keys, ``app/queue/arq_adapter.py``, has
its own contract test.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import arq.worker

import app
from tests.unit.test_library_surface import SOURCES, library_imports


def test_the_project_does_use_arq_through_its_public_names() -> None:
    used = {
        name
        for path in SOURCES
        for module, name in library_imports(ast.parse(path.read_text()))
        if module.split(".")[0] == "arq"
    }
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
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found
