"""A name another module imports is public: what modules share has a name without a leading underscore.

Private modules (``_compat``, ``_util``) are the package's own helpers and may be imported whole; a private
*name* imported from another module is an API nobody promised to keep, and it breaks silently when renamed.
"""

import ast
import sys
from pathlib import Path

import commhooks_lab as lab

PACKAGE = Path(lab.__file__).parent

#: TODO(lead): the imports of a private name that issue 53's other parts remove (the rank spec replaces
#: experiment._Ranks; result.py's frame converters are for the engineer who owns it). Shrink this, never grow it.
ELSEWHERE = {
    ("studies/links.py", "result._frame_from_json"),
    ("studies/links.py", "result._frame_to_json"),
}


def _module_of(path: Path, node: ast.ImportFrom) -> str:
    """The imported module's dotted name inside the package, e.g. ``studies.overlap``."""
    package = path.relative_to(PACKAGE).parent.parts
    if node.level == 0:
        return (node.module or "").removeprefix("commhooks_lab").lstrip(".")
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_module(dotted: str, name: str) -> bool:
    folder = PACKAGE.joinpath(*dotted.split(".")) if dotted else PACKAGE
    return (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()


def private_imports() -> set[tuple[str, str]]:
    """(file, module.name) for every ``from <a module of the lab> import _name`` whose _name is not a module."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and not (node.module or "").startswith("commhooks_lab"):
                continue  # torch's and other libraries' private names go through _compat, checked elsewhere
            dotted = _module_of(path, node)
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and not _is_module(dotted, alias.name):
                    found.add((path.relative_to(PACKAGE).as_posix(), f"{dotted}.{alias.name}".lstrip(".")))
    return found


def test_the_finder_sees_a_private_import_in_every_form(tmp_path, monkeypatch):
    """The check below could pass by finding nothing: it finds each way of writing one."""
    fake = tmp_path / "commhooks_lab"
    (fake / "studies").mkdir(parents=True)
    (fake / "_util.py").write_text("")
    (fake / "studies" / "a.py").write_text(
        "from .overlap import _union, hidden_share\nfrom .. import _util\nfrom ..experiment import _Ranks\n"
        "from commhooks_lab.exercises import _say\nfrom torch.distributed import _functional_collectives\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert private_imports() == {
        ("studies/a.py", "studies.overlap._union"),
        ("studies/a.py", "experiment._Ranks"),
        ("studies/a.py", "exercises._say"),
    }


def test_no_module_imports_another_modules_private_name():
    """The exercise modules share exercises/checking.py's public names; notebook 13's exercise builds its hints
    from studies/overlap.py's public interval helpers."""
    assert private_imports() - ELSEWHERE == set()
