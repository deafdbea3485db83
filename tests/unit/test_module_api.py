"""A module's API part named by import path: loaded when the API asks for it, a clear error when it cannot be."""

from __future__ import annotations

import pytest

from app.core.module import ApiPart, FeatureModule
from app.ops.module import MODULE as OPS

NOT_AN_API_PART = "a string"


def test_a_module_names_its_api_part_by_path_and_the_api_loads_it() -> None:
    part = OPS.api_part()
    assert isinstance(part, ApiPart) and part.route_handlers and part.dependencies and part.template_dirs
    assert FeatureModule(name="jobs-only").api_part() == ApiPart()


def test_a_path_that_names_nothing_or_something_else_says_which() -> None:
    with pytest.raises(ImportError, match=r"module 'x': api 'app.no_such_module:API' cannot be loaded"):
        FeatureModule(name="x", api="app.no_such_module:API").api_part()
    with pytest.raises(TypeError, match=r"is a str, not a ApiPart"):
        FeatureModule(name="x", api=f"{__name__}:NOT_AN_API_PART").api_part()
