"""The one versioned envelope of every saved form: loader states, lane states, checkpoints.

Each saved form names its format and version, and each is read by one check
that raises :class:`~zephon_jax.errors.StateError` naming what it found and
what this release reads:

* a loader state (a dict): ``{"format": "zephon_jax.state.global_state", "version": 1, ...}``;
* a lane state (bytes): its encoded tuple starts with the lane format version
  (the format name is implied by where it sits, to keep lane states small);
* an Orbax checkpoint item's ``meta.json``:
  ``{"format": "zephon_jax.checkpoint", "version": 1, ...}``;
* a state saved as one file: a first line ``zephon_jax.state.global_state-file 1``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from zephon_jax.errors import StateError


@dataclasses.dataclass(frozen=True)
class Envelope:
    """A saved form's format name and the version this release reads and writes."""

    format: str
    version: int

    def header(self) -> dict[str, Any]:
        """The envelope's entries, to start a saved dict with."""
        return {"format": self.format, "version": self.version}

    def check_version(self, found: Any, what: str) -> None:
        """Raises unless ``found`` is this envelope's version (an int, not text)."""
        if not is_int(found):
            raise StateError(
                f"{what}'s 'version' is {found!r} ({type(found).__name__}); a {self.format} "
                f"version is an int ({self.version}): the state was altered"
            )
        if int(found) != self.version:
            raise StateError(
                f"{what} has version {int(found)}; this zephon_jax reads version "
                f"{self.version}: restore it with the zephon_jax release that wrote it"
            )

    def check(self, saved: Any, what: str) -> None:
        """Raises unless ``saved`` is a dict with this envelope's format and version."""
        if not isinstance(saved, Mapping):
            raise StateError(f"{what} is a dict; got {type(saved).__name__}")
        for key in ("format", "version"):
            if key not in saved:
                raise StateError(
                    f"{what} has no {key!r} entry; it is not a {self.format} (or it was truncated)"
                )
        if saved["format"] != self.format:
            raise StateError(f"{what}'s format is {saved['format']!r}, not {self.format!r}")
        self.check_version(saved["version"], what)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or numpy), and not a bool."""
    if type(value) is int:  # the common case, checked quickly
        return True
    import numpy as np

    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


STATE = Envelope("zephon_jax.state.global_state", 1)
# Lane 2: lane bytes end with a CRC-32 of the encoding. 3: carries are saved as (held
# lineages, aux), operator outputs as (parents, recipe). 4: the lane's step and its
# mixture carry. 5: the CRC starts from the lane number, numpy scalars keep their dtype.
# 6: first_fit's open rows are saved in the order they opened (an emitted row's place
# goes to the end), so a state of 5 would go on with other rows. 7: a shuffled mixture
# by records reads each component's draws in order inside a block of its schedule, so
# the positions of a state of 6 would name other records. 8: the lane's accounting
# (delivered tokens, segments, documents and epochs per source, tokens per mixture stage
# and component, steps skipped) follows the mixture carry.
LANE = Envelope("zephon_jax.engine.lane", 8)
CHECKPOINT = Envelope("zephon_jax.checkpoint", 1)
# A state saved as one file starts with the line "zephon_jax.state.global_state-file 1".
STATE_FILE = Envelope("zephon_jax.state.global_state-file", 1)
