"""Notes about this machine (a refused namespace, a build of torch), said once per process and kept apart from results.

A note is a fact about where the lab runs, not about the hook a learner studies: the same notebook is right on a
machine that cannot build a link or that holds another build of torch. In a notebook a note is one markdown output
whose metadata carries :data:`METADATA_KEY`, so the lab's nbval plugin leaves it out of every comparison (the
committed outputs were made on a machine that had nothing to say). Outside a kernel it goes to stderr as a warning.

Stdlib only (the launcher decides some of these before torch loads); IPython is used only where it is running.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["METADATA_KEY", "is_note", "say", "say_once"]

#: The output metadata key that marks a note; its value names the note (``"user_namespaces"``, ...).
METADATA_KEY = "commhooks_lab_machine_note"
_said: set[str] = set()


def _kernel():
    """The running IPython kernel's shell, or None (a script, a rank, pytest without a kernel)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def say(name: str, text: str, stacklevel: int = 2) -> None:
    """Say ``text`` now, under ``name``: a marked markdown output in a kernel, else a warning (a cell that runs
    again says it again: what it shows rests on it each time). ``stacklevel``: as ``warnings.warn``'s, counted
    from the caller (1: the caller's line, 2: its caller's)."""
    if _kernel() is None:
        warnings.warn(text, RuntimeWarning, stacklevel=stacklevel + 1)
        return
    from IPython.display import display

    bundle = {"text/markdown": f"> **On this machine:** {text}", "text/plain": f"On this machine: {text}"}
    display(bundle, raw=True, metadata={METADATA_KEY: name})


def say_once(name: str, text: str, stacklevel: int = 2) -> bool:
    """:func:`say` ``text`` once in this process under ``name``.

    Returns whether it was said now (False when it had been said before)."""
    if name in _said:
        return False
    _said.add(name)
    say(name, text, stacklevel=stacklevel + 1)
    return True


def is_note(output: dict) -> bool:
    """Is this notebook output (nbformat's dict) a machine note?"""
    return METADATA_KEY in (output.get("metadata") or {})
