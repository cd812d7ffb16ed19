"""``StatusLine``: rewritten in place on a terminal, whole lines at most every
``log_interval`` seconds elsewhere, nothing without a stream."""

from __future__ import annotations

import io

from zephon_jax.core.status_line import StatusLine, is_terminal


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Closed(io.StringIO):
    def isatty(self):
        raise ValueError("I/O operation on closed file")


def test_is_terminal():
    assert is_terminal(Terminal())
    assert not is_terminal(io.StringIO())
    assert not is_terminal(Closed())  # cannot say: not a terminal
    assert not is_terminal(object())  # type: ignore[arg-type]


def test_on_a_terminal_the_line_is_rewritten_in_place_and_padded():
    out = Terminal()
    line = StatusLine(out, interval=1000.0)
    line.show("abcdef")  # the first update shows at once
    line.show("skipped")  # within the interval
    line.show("xy", force=True)
    assert out.getvalue() == "\rabcdef\rxy    "  # blanks out the longer line before it
    line.done()
    line.done()  # once only
    assert out.getvalue().endswith("    \n") and out.getvalue().count("\n") == 1


def test_a_note_on_a_terminal_goes_above_and_the_status_line_shows_again():
    out = Terminal()
    line = StatusLine(out, interval=1000.0)
    line.show("1234")
    line.note("hi")
    assert out.getvalue() == "\r1234\rhi  \n"
    assert line.due()  # shown again at once, below the note
    line.show("5")
    assert out.getvalue().endswith("\n\r5   ")


def test_off_a_terminal_each_update_is_a_line_and_the_first_waits_an_interval():
    out = io.StringIO()
    line = StatusLine(out, interval=0.0, log_interval=1000.0)
    assert line.interval == 1000.0 and not line.due()
    line.show("early")  # a short step prints nothing
    line.show("last", force=True)
    line.note("a note")
    line.done()  # nothing shown in place: nothing to end
    assert out.getvalue() == "last\na note\n"


def test_off_a_terminal_lines_are_printed_once_the_interval_passed():
    out = io.StringIO()
    line = StatusLine(out, log_interval=0.0)
    line.show("one")
    line.show("two")
    assert out.getvalue() == "one\ntwo\n"


def test_without_a_stream_nothing_is_shown():
    line = StatusLine(None)
    line.show("x", force=True)
    line.note("y")
    line.done()
    assert not line.due() and not line.terminal
