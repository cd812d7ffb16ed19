"""Sphinx configuration for the zephon_jax documentation.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
Pages are Markdown (MyST); the API reference is generated from docstrings.
"""

from __future__ import annotations

import zephon_jax

project = "zephon_jax"
author = "The zephon_jax authors"
copyright = "2026, The zephon_jax authors"
release = zephon_jax.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "requirements.txt"]

myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
autosummary_generate = False  # summary tables link to the entries on the API page
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# The theme of the JAX ecosystem's documentation (JAX, Flax, Grain).
html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_title = f"zephon_jax {release}"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "home_page_in_toc": True,
}
pygments_style = "default"
