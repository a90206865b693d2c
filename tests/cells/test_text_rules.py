"""One rule for names and ids, Nova's: its ``parameter_types.name`` pattern allows a
character unless its Unicode category is C* (control, format, surrogate, private use,
unassigned) or Z* other than Zs (line and paragraph separators)."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from cellsight.cells.errors import InvalidText
from cellsight.cells.text_rules import check_text, unprintable


def _nova_printable(char: str) -> bool:
    category = unicodedata.category(char)
    return not category.startswith("C") and (not category.startswith("Z") or category == "Zs")


def test_every_code_point_as_nova_reads_it() -> None:
    """Python's ``isprintable`` shortcut never lets through what Nova refuses."""
    wrong = [
        hex(code)
        for code in range(sys.maxunicode + 1)
        if (unprintable(f"a{chr(code)}b") is None) != _nova_printable(chr(code))
    ]
    assert wrong == []


@pytest.mark.parametrize("value", ["web-1", "web 1", "caf\u00e9", "a\u00a0b", "\U0001f600"])
def test_printable_names_pass(value: str) -> None:
    check_text("name", value)


@pytest.mark.parametrize("char", ["\x00", "\t", "\n", "\x7f", "\x85", "\u200b", "\u2029"])
def test_the_refused_character_is_named(char: str) -> None:
    with pytest.raises(InvalidText, match=f"U\\+{ord(char):04X}") as caught:
        check_text("name", f"web{char}1")
    assert caught.value.field == "name" and "\n" not in str(caught.value)
