"""A status line for long steps (``prepare``'s progress, building JSONL indexes).

On a terminal the line is rewritten in place (a carriage return, then the new
text). Anywhere else (a log file, a pipe, a notebook cell) carriage returns would
run the updates together, so each update is a line of its own, printed at most
every ``log_interval`` seconds (and always when forced, e.g. the last one).
"""

from __future__ import annotations

import math
import time
from typing import TextIO


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (False when it cannot say)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class StatusLine:
    """One status line on ``stream`` (see the module docstring); ``None``: prints nothing.

    ``interval``: seconds between updates on a terminal; ``log_interval``: seconds
    between lines elsewhere.
    """

    def __init__(
        self, stream: TextIO | None, interval: float = 0.25, log_interval: float = 10.0
    ) -> None:
        self.stream = stream
        self.terminal = stream is not None and is_terminal(stream)
        self.interval = interval if self.terminal else log_interval
        # Off a terminal the first line waits for an interval too: a short step prints once.
        # (-inf, not 0: the clock counts from boot, which may be under an interval ago)
        self.last = -math.inf if self.terminal else time.perf_counter()
        self.width = 0  # of the widest line shown in place (to blank it out)
        self.showing = False  # a line is shown in place, not yet ended by a newline

    def show(self, line: str, force: bool = False) -> None:
        """Shows ``line`` if ``interval`` has passed since the last one, or if ``force``."""
        if self.stream is None:
            return
        now = time.perf_counter()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        if self.terminal:
            self.width = max(self.width, len(line))
            self.stream.write("\r" + line.ljust(self.width))
            self.showing = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def due(self) -> bool:
        """Whether the next :meth:`show` would print (to skip composing a line otherwise)."""
        return self.stream is not None and time.perf_counter() - self.last >= self.interval

    def note(self, text: str) -> None:
        """Prints ``text`` as a line of its own, above the status line on a terminal."""
        if self.stream is None:
            return
        if self.terminal:
            self.stream.write("\r" + text.ljust(self.width) + "\n")
            self.last = -math.inf  # show the status line again at once, below the note
            self.showing = False
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        """Ends the line shown in place (a newline), if any."""
        if self.stream is not None and self.showing:
            self.stream.write("\n")
            self.stream.flush()
            self.showing = False
