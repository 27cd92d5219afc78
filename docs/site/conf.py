"""Sphinx settings for the course's website (scripts/build_site.py stages the pages and runs Sphinx).

myst-nb renders the committed notebooks with their outputs and never runs a cell; furo is a theme
that ships all its assets, so the site builds and reads offline.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for heading_slugs, named below as a string

project = "commhooks_lab"
author = "the commhooks_lab developers"
extensions = ["myst_nb", "sphinx-mathjax-offline"]  # MathJax 3 from the package, not a CDN
nb_execution_mode = "off"  # the committed outputs are the lesson: nbval checks them, the site shows them
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "html_image"]
myst_heading_anchors = 3
myst_heading_slug_func = "heading_slugs.jupyterlab_slug"  # links work in JupyterLab and here
html_theme = "furo"
html_title = "commhooks_lab: DDP communication hooks, run and measured"
html_static_path: list[str] = []
exclude_patterns = ["_build", "**.ipynb_checkpoints", "conf.py", "heading_slugs.py"]
suppress_warnings = ["mystnb.unknown_mime_type"]
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
