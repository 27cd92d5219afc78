"""Heading anchors as JupyterLab writes them, so one link works in JupyterLab and on the site.

JupyterLab's anchor for a heading is its text with each space made a ``-`` (case and punctuation kept:
``04_powersgd.ipynb#What-start_powerSGD_iter-is-for``). MyST's default lowercases and drops punctuation, which
would make the notebooks' links to each other's headings break on one of the two.
"""


def jupyterlab_slug(text: str) -> str:
    return "-".join(text.split())
