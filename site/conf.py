"""Sphinx configuration of the course's website (`make site`, scripts/build_site.py).

scripts/build_site.py writes the source folder (build/site-src: the lessons with their attachments
as files, the start page, the docs, the course_lib reference pages) and runs sphinx-build with this
folder as its configuration directory. The lessons are rendered from their stored outputs and never
run (nb_execution_mode "off"). Nothing on a page is fetched from another host: MathJax 2.7 (from
the PyPI package jupyter-server-mathjax), d3 and jQuery for bertviz's views (requirements-js.txt)
and the theme's own files are all under _static/.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path(os.environ.get("COURSE_SITE_SOURCE", ROOT / "build" / "site-src"))
sys.path.insert(0, str(ROOT))  # autodoc imports course_lib from this clone

project = "Transformers from Scratch"
author = "the course's authors"
copyright = "the course's authors, MIT License"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.mathjax"]
exclude_patterns = ["_static", "**/.ipynb_checkpoints"]
root_doc = "index"

# The stored notebooks, never run: strict nbval already proves their outputs.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 4  # docs link to "developers.md#setup-what-make-setup-installs-and-fetches"
myst_update_mathjax = False  # MathJax 2 is configured below

# MathJax 2.7 served from the site, with the only fonts that copy ships (STIX-Web).
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {
    "tex2jax": {
        "inlineMath": [["\\(", "\\)"]],
        "displayMath": [["\\[", "\\]"]],
        "processRefs": False,
        "processEnvironments": True,
        "processClass": "math",
        "ignoreClass": "mathjax_ignore",
    },
    # As Jupyter configures this copy: no local fonts looked for, STIX-Web from the site, no
    # image fonts. HTML-CSS detects web fonts against a font "MathJax_Blank" at url('about:blank'),
    # which Chromium refuses with a console error: a local() name that is never there does the same.
    "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web",
                 "imageFont": None,
                 "styles": {"@font-face": {"font-family": "MathJax_Blank",
                                           "src": "local('MathJax_Blank_none')"}}},
    # No fast preview: its CSS asks for the TeX fonts (MathJax_AMS, ...), which this copy lacks.
    "fast-preview": {"disabled": True},
    "menuSettings": {"zoom": "None", "CHTMLpreview": False},
    "showMathMenu": False,
}
mathjax3_config = None
mathjax4_config = None

html_theme = "sphinx_book_theme"
html_context = {"default_mode": "light"}  # else the theme logs an error on a first visit
html_title = "Transformers from Scratch"
html_favicon = "favicon.svg"  # else browsers ask for /favicon.ico, which a static host lacks
html_static_path = [str(SOURCE / "_static")]
html_css_files = ["course/site.css"]
html_copy_source = False  # the lesson's own .ipynb sits beside its page (its download button)
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "show_prev_next": True,
}

autodoc_default_options = {"members": True, "member-order": "bysource", "undoc-members": False}
autodoc_typehints = "description"
autodoc_inherit_docstrings = False
autodoc_mock_imports: list[str] = []
suppress_warnings = ["myst.header", "misc.highlighting_failure", "autodoc.import_object",
                     "toc.not_included"]


def docstring_as_written(app, what, name, obj, options, lines):
    """course_lib's docstrings are plain text (shapes, ``code``, lists by indentation), not
    reStructuredText: show each as written, in a literal block, rather than misread it."""
    if lines:
        lines[:] = ["::", ""] + ["   " + line for line in lines] + [""]


def setup(app):
    app.connect("autodoc-process-docstring", docstring_as_written)
