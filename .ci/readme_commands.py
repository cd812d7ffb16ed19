"""Print the README's fresh-machine commands, one a line, exactly as the README states them.

CI runs what this prints, so the README and CI cannot drift apart. The commands are the
``bash`` code blocks of the section "Fresh machine: the two commands" (up to the next
heading of the same or a higher level); each block must hold exactly one command line.

Usage: ``python3 .ci/readme_commands.py [README.md]``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SECTION = "Fresh machine: the two commands"


def fresh_machine_commands(text: str) -> list[str]:
    """The one-line commands of the ``bash`` blocks in the section ``SECTION`` of ``text``.

    Raises ``ValueError`` naming what is wrong when the section is missing, holds no or more
    than two blocks, or a block is not exactly one non-empty line.
    """
    heading = re.search(rf"^(#+) {re.escape(SECTION)}\s*$", text, re.M)
    if heading is None:
        raise ValueError(f"the README has no heading {SECTION!r}; CI takes its commands from it")
    level = len(heading.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, heading.end())
    body = text[heading.end() : end.start() if end else len(text)]
    blocks = re.findall(r"^```bash\n(.*?)^```", body, re.M | re.S)
    if len(blocks) != 2:
        raise ValueError(
            f"the README's section {SECTION!r} has {len(blocks)} bash blocks; it must have "
            "two (the demo command and the test command)"
        )
    commands = []
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip()]
        if len(lines) != 1:
            raise ValueError(
                f"a bash block of the README's section {SECTION!r} has {len(lines)} lines; "
                "each must be one command line (join steps with &&)"
            )
        commands.append(lines[0].strip())
    return commands


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "README.md"
    try:
        commands = fresh_machine_commands(path.read_text(encoding="utf-8"))
    except ValueError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print("\n".join(commands))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
