"""The console's templates keep to what its CSP and escaping promise, as written: no
inline script, style or event handler, and nothing marked safe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import daemon.admin.console

TEMPLATES = sorted((Path(daemon.admin.console.__file__).parent / "templates").glob("*.html"))


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda path: path.name)
def test_a_template_has_no_inline_script_style_or_handler(template: Path) -> None:
    text = template.read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", text) == []
    assert re.findall(r"<style\b|\sstyle=", text) == []
    assert re.findall(r"\son[a-z]+=", text) == []


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda path: path.name)
def test_a_template_marks_nothing_safe(template: Path) -> None:
    """Autoescape holds for every value: no `|safe`, no `{% autoescape false %}`."""
    text = template.read_text()
    assert re.findall(r"\|\s*safe\b|autoescape\s+false", text) == []
