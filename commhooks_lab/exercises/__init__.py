"""Exercises that start unsolved: each check says "not attempted", "not yet" (with a hint) or "right".

A notebook's exercise cell starts as a stub (``raise NotImplementedError``, or ``my_prediction = None``).
Its check never stops the notebook: a stub or a wrong attempt prints what to do and hands back the
reference solution, so every later cell still runs (and nbval stays strict); a right attempt is
used from then on. Reference solutions are shown only on request (:func:`reveal`), never printed
by a check. One module per notebook holds that notebook's checks and references; what they share
is in :mod:`.checking`.
"""

from . import checking
from .checking import *  # noqa: F403  (what notebooks and tests import from here: reveal, RIGHT, check_function, ...)

__all__ = list(checking.__all__)
