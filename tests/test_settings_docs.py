"""docs/contracts.md §6 "Settings path" carries one table per declared settings section, generated from
the declaration (contract/settings/): the checked-in tables are what the declarations render.

    .venv/bin/python tests/test_settings_docs.py   # rewrites the tables in place
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from txnkeeper.contract.settings.schema import Section, doc_table
from txnkeeper.contract.settings.sections import SECTIONS

DOC = Path(__file__).resolve().parents[1] / "docs/contracts.md"


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- settings:{name} -->\n)(.*?)(<!-- /settings:{name} -->)", re.DOTALL)


def rewrite(text: str) -> str:
    for section in SECTIONS:
        found = _block(section.name).search(text)
        if found is not None:
            text = text[: found.start(2)] + doc_table(section) + text[found.end(2) :]
    return text


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.name)
def test_each_section_has_its_generated_table(section: Section) -> None:
    found = _block(section.name).search(DOC.read_text(encoding="utf-8"))
    assert found is not None, f"docs/contracts.md has no <!-- settings:{section.name} --> block"
    assert found[2] == doc_table(section), "run: .venv/bin/python tests/test_settings_docs.py"


if __name__ == "__main__":
    DOC.write_text(rewrite(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    sys.exit(0)
