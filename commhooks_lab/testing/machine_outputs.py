"""Which committed outputs a cell is compared with on this machine, and which outputs are not compared at all.

Two things about where a notebook runs change what a correct cell prints, and neither is a regression:

- **Notes** (:mod:`commhooks_lab.launcher.notes`): a machine that refuses user namespaces says so once. Outputs
  marked as notes are left out of both sides of every comparison.
- **Variants**: a cell whose output rightly depends on the machine (DDP accepts ``bf16_compress_hook`` on a CUDA
  build of torch and refuses it on a CPU build) keeps, in its metadata, the outputs of each other kind of machine:

  .. code-block:: json

     {"commhooks_lab": {"outputs_when": [{"when": {"torch_build": "cuda"}, "outputs": [...]}]}}

  On a machine whose facts match a variant's ``when``, that variant's outputs are the reference; elsewhere the
  cell's own outputs are. Each variant is still compared strictly (or within tolerance), so the cell stays
  regression-checked on every kind of machine it has outputs for.

``scripts/record_variants.py`` writes the variants from a notebook executed on the other kind of machine, only for
cells that declare which facts their outputs depend on (``{"commhooks_lab": {"depends_on": {"torch_build": why}}}``)
and only where the two machines differ in one of those facts (:func:`what_to_record`).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

from ..launcher.notes import is_note

__all__ = [
    "declared_facts",
    "FACTS",
    "machine_fact",
    "machine_facts",
    "reference_outputs",
    "set_variant",
    "variant_key",
    "what_to_record",
    "without_notes",
]

#: The facts a variant may name, and what each means.
FACTS = {
    "torch_build": "'cuda' where torch was built with CUDA (torch.version.cuda is set, GPU or not), else 'cpu'",
    "user_namespaces": "True where this account may create a user namespace (links, the private network)",
}
#: The cell metadata key under which variants are kept.
variant_key = "commhooks_lab"


def _torch_build() -> str:
    """``FACTS["torch_build"]``, from torch's generated ``version.py`` where torch is not imported yet: nbval's
    process needs no torch otherwise, and importing it costs seconds of CPU per run."""
    if "torch" not in sys.modules:
        try:
            found = importlib.util.find_spec("torch")
            assert found is not None and found.origin is not None
            spec = importlib.util.spec_from_file_location("_torch_version", Path(found.origin).parent / "version.py")
            assert spec is not None and spec.loader is not None
            version = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(version)
            return "cuda" if version.cuda else "cpu"
        except Exception:  # another layout of torch's files: ask torch itself
            pass
    import torch

    return "cuda" if torch.version.cuda else "cpu"


def _user_namespaces() -> bool:
    from ..launcher.netns_switch import why_unavailable

    return why_unavailable() is None


_READERS = {"torch_build": _torch_build, "user_namespaces": _user_namespaces}


@functools.cache
def machine_fact(name: str):
    """This machine's value of one of :data:`FACTS`, found only when asked for (the namespace is tried by a child)."""
    return _READERS[name]()


def machine_facts() -> dict:
    """This machine's values of :data:`FACTS` (torch's build is read, the namespace is tried by a child)."""
    return {name: machine_fact(name) for name in FACTS}


def _check_when(when: dict) -> None:
    unknown = set(when) - set(FACTS)
    if unknown:
        raise ValueError(f"a variant names unknown facts {sorted(unknown)}; known: {sorted(FACTS)}")


def reference_outputs(cell_metadata: dict, committed: list, facts: dict | None = None) -> list:
    """The outputs this machine's run of the cell is compared with: the first variant whose ``when`` matches
    ``facts`` (this machine's by default), else the ``committed`` ones."""
    variants = (cell_metadata.get(variant_key) or {}).get("outputs_when") or []
    if not variants:
        return committed
    for variant in variants:
        _check_when(variant["when"])
        here = {name: machine_fact(name) for name in variant["when"]} if facts is None else facts
        if all(here.get(name) == value for name, value in variant["when"].items()):
            import nbformat

            return [nbformat.from_dict(o) for o in variant["outputs"]]  # nbval reads outputs as attributes too
    return committed


def without_notes(outputs: list) -> list:
    """``outputs`` less the machine notes."""
    return [o for o in outputs if not is_note(o)]


def declared_facts(cell_metadata: dict) -> dict[str, str]:
    """The facts a cell declares its outputs depend on, each with why (``commhooks_lab.depends_on``)."""
    declared = (cell_metadata.get(variant_key) or {}).get("depends_on") or {}
    _check_when(declared)
    return dict(declared)


def what_to_record(cell_metadata: dict, differs: bool, here: dict, there: dict) -> tuple[str, dict | str | None]:
    """What recording does with one cell executed on a machine with facts ``there``, its committed outputs made
    on one with facts ``here``: ``("record", when)``, ``("drop", when)`` (a stale variant: the outputs agree now),
    ``("same", None)``, or ``("refuse", why)`` where the difference is not explained by a fact the cell declares."""
    declared = declared_facts(cell_metadata)
    explaining = sorted(name for name in declared if here.get(name) != there.get(name))
    when = {name: there[name] for name in explaining}
    if not differs:
        stale = any(v["when"] == when for v in (cell_metadata.get(variant_key) or {}).get("outputs_when") or [])
        return ("drop", when) if explaining and stale else ("same", None)
    if not declared:
        return "refuse", "its outputs differ and it declares no fact they depend on (a regression, or mark the cell)"
    if not explaining:
        same = ", ".join(f"{name}={here.get(name)!r}" for name in sorted(declared))
        return "refuse", f"its outputs differ, but both machines have the facts it declares ({same})"
    return "record", when


def set_variant(cell_metadata: dict, when: dict, outputs: list | None) -> None:
    """Keep ``outputs`` as the cell's variant for ``when`` (replacing one for the same ``when``); None drops it."""
    _check_when(when)
    lab = cell_metadata.setdefault(variant_key, {})
    variants = [v for v in lab.get("outputs_when") or [] if v["when"] != when]
    if outputs is not None:
        variants.append({"when": dict(when), "outputs": [dict(o) for o in outputs]})
    if variants:
        lab["outputs_when"] = variants
    else:
        lab.pop("outputs_when", None)
