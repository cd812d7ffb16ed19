"""The tokenization and training-batch pages' examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("page", ["tokenization.md", "training_batches.md"])
def test_page_examples_run(page):
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)
    assert blocks
    namespace: dict = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, page, "exec"), namespace)


def test_text_pages_are_in_the_toctree():
    index = (DOCS / "index.md").read_text()
    for page in ("tokenization", "chat_masks", "training_batches"):
        assert f"\n{page}\n" in index and (DOCS / f"{page}.md").is_file()
