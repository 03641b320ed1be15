"""Domain errors and how messages are printed (``trainers.errors``)."""

from __future__ import annotations

from trainers.errors import printable


def test_printable_escapes_control_characters_and_lone_surrogates_only():
    text = "a\x1b[31mX\x1b[0m\r\n\t\x00\x9b\x7f\ud800 é 字 \\ '\""
    assert printable(text) == "a\\x1b[31mX\\x1b[0m\\r\\n\\t\\x00\\x9b\\x7f\\ud800 é 字 \\ '\""
    assert printable("width: expected int, got 'x'") == "width: expected int, got 'x'"
