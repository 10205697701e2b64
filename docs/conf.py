"""Sphinx configuration of cupyconv's API reference, which autodoc builds from the docstrings (NumPy style).

Build it from the checkout (CI does, in .ci/run, with warnings as errors):

    pip install -e ".[docs]" && python -m sphinx -W --keep-going -b html docs docs/_build/html
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's cupyconv, installed or not

import cupyconv  # noqa: E402

project = "cupyconv"
author = "the cupyconv developers"
copyright = f"2026, {author}"
version = release = cupyconv.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = False
default_role = "py:obj"          # `name` in a docstring links to that object where the reference documents it
autodoc_member_order = "bysource"
autodoc_typehints = "signature"  # the types in the signature; the Parameters sections give shapes and meaning
# Signatures name the argument types of cupyconv._typing (listed at the end of api.rst) instead of spelling out
# their unions; not Ints, which appears as `Ints | None`, an alias inside a union Sphinx 9 prints as a raw
# TypeAliasForwardRef.
autodoc_type_aliases = {name: f"cupyconv._typing.{name}" for name in ("IntOrTuple", "Padding", "Needs", "Gradients")}
python_use_unqualified_type_names = True

exclude_patterns = ["_build"]
html_theme = "alabaster"
