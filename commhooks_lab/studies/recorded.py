"""Runs behind real links, recorded on a machine that could build them, for a machine that cannot.

A study that needs links (``lab.studies.links``) keeps what it measured whenever ``scripts/execute_notebooks.py``
runs it: the script names a file in :data:`VARIABLE`, and once every notebook ran it installs that file as
``recorded/<notebook>.json`` with a digest of the notebook's code. Where this machine refuses user namespaces,
the same call returns its recording, with a note that says so; a call that was never recorded is refused as
``link=`` is. A test holds each recording's digest to its notebook's code: one cannot change without the other.
:data:`REPLAY_VARIABLE` asks for the recordings where links could be built: the check of the notebooks on other
kernel paths runs two notebooks at once beside the suite, where timing claims measure the load, not the links.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..launcher import netns_switch, notes

__all__ = [
    "code_digest",
    "DIRECTORY",
    "keep",
    "link_sections",
    "links_report",
    "replay",
    "REPLAY_VARIABLE",
    "VARIABLE",
    "why_replayed",
]

#: The recordings the package ships, one file per notebook.
DIRECTORY = Path(__file__).parent / "recorded"
#: Set by ``scripts/execute_notebooks.py`` in the kernel's environment: the file a study appends its runs to.
VARIABLE = "COMMHOOKS_LAB_RECORD_TO"
#: Set to 1: the studies replay their recordings even where links can be built (:func:`why_replayed`).
REPLAY_VARIABLE = "COMMHOOKS_LAB_REPLAY_LINKS"
#: A code line that asks for a real link: ``link="10mbit"``, ``links=("unlimited", ...)`` (not ``link=None``).
ASKS_FOR_A_LINK = re.compile(r"\blinks?\s*=\s*[\"'(\[]")


def _plain(arguments: Mapping[str, Any]) -> Any:
    """The arguments as JSON reads them back (tuples become lists), so that a call and its recording compare."""
    return json.loads(json.dumps(arguments, sort_keys=True))


def _this_machine() -> dict:
    import torch

    return {
        "date": datetime.date.today().isoformat(),
        "cpu": _cpu_name(),
        "torch": torch.__version__,
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def keep(study: str, arguments: Mapping[str, Any], data: Any) -> None:
    """Append one run to the file :data:`VARIABLE` names (nothing when it is unset: a learner's own runs)."""
    target = os.environ.get(VARIABLE)
    if not target:
        return
    path = Path(target)
    kept = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    kept["runs"].append({"study": study, "arguments": _plain(arguments), "recorded_on": _this_machine(), "data": data})
    path.write_text(json.dumps(kept, indent=1))


#: What a replay asked for by :data:`REPLAY_VARIABLE` says of itself.
_ASKED = f"{REPLAY_VARIABLE}=1 asks for the recorded runs"


def _replay_asked() -> bool:
    return os.environ.get(REPLAY_VARIABLE) == "1"


def why_replayed() -> str | None:
    """Why a study replays its recording instead of building links (None: it builds them)."""
    return _ASKED if _replay_asked() else netns_switch.why_unavailable()


def _not_built(asked: str) -> str:
    if _replay_asked():
        return f"{asked} is not built here: {_ASKED}"
    return f"{asked} cannot be built here: {netns_switch.facts()['refused']}"


def _recordings() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(DIRECTORY.glob("*.json"))]


def replay(study: str, arguments: Mapping[str, Any], asked: str) -> Any:
    """The recorded run of this call, said to be one (a machine note); refused if nobody recorded it.

    ``asked``: what the call needs, as the note and the refusal name it (``link='10mbit'``)."""
    why = why_replayed()
    wanted = _plain(arguments)
    for recording in _recordings():
        for run in recording["runs"]:
            if run["study"] == study and run["arguments"] == wanted:
                machine = run["recorded_on"]
                notes.say(
                    "recorded_links",
                    f"{_not_built(asked)}. What follows was measured "
                    f"on a machine that could ({machine['cpu']}, torch {machine['torch']}, {machine['date']}), not "
                    "on this one.",
                    stacklevel=3,
                )
                return run["data"]
    raise netns_switch.NetworkUnavailableError(
        f"{asked} cannot be built on this machine: {why}; and no run of this call was recorded on one that could "
        f"({DIRECTORY} keeps the lessons' own); {netns_switch.WITHOUT_A_LINK}"
    )


def code_digest(notebook: Mapping[str, Any]) -> str:
    """sha256 of a notebook's code cells (nbformat's dict), in order: what its recording was made from."""
    sources = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    return hashlib.sha256("\n\0\n".join(sources).encode()).hexdigest()


def link_sections() -> list[str]:
    """The course's sections whose code asks for a real link, found in the notebooks themselves:
    ``"notebook 8, 6. On real slow links: ..."`` (the heading above the first such cell of each section)."""
    from ..course import course_root

    found = []
    for path in sorted((course_root() / "notebooks").glob("[0-9]*.ipynb")):
        heading = ""
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                headings = [line.lstrip("#").strip() for line in source.splitlines() if line.startswith("## ")]
                heading = headings[-1] if headings else heading
            elif ASKS_FOR_A_LINK.search(source):
                section = f"notebook {int(path.name[:2])}, {heading}"
                if section not in found:
                    found.append(section)
    return found


#: The way out on the common kinds of machine that refuse user namespaces.
COMMON_WAYS_OUT = (
    "Ubuntu 24.04: `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`",
    "Docker: `docker run --security-opt seccomp=unconfined` (or `--cap-add SYS_ADMIN`, which allows far more)",
    "a hosted notebook service (Colab, Kaggle, ...): none",
)


def links_report() -> dict | None:
    """What ``doctor`` says about links: None where this machine builds them; else ``seen`` (why not, and the
    sections that show recorded runs instead) and ``advice`` (this machine's way out, then the common ones)."""
    facts = netns_switch.facts()
    if facts["refused"] is None:
        return None
    sections = "; ".join(link_sections())
    return {
        "seen": f"no rate-limited links here: {facts['refused']}. These sections show runs recorded on a machine "
        f"that could: {sections}",
        "advice": f"{facts['way_out']}. Elsewhere: " + "; ".join(COMMON_WAYS_OUT),
    }
