"""docs/configuration.md names every setting, and only the settings there are."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from app.core.settings import Settings, env_var_name

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `(?P<name>[A-Z][A-Z0-9_]*)` \|")


def test_the_configuration_guide_lists_exactly_the_settings() -> None:
    section = GUIDE.read_text(encoding="utf-8").split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = [found["name"] for line in section.splitlines() if (found := ROW.match(line))]

    assert sorted(documented) == sorted(env_var_name(item.name) for item in fields(Settings))
    assert len(documented) == len(set(documented))
