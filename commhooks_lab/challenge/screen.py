"""What a submission's source may use, checked before any of it runs: an allowlist, not a blocklist.

A submission is a hook and the state it keeps: tensor arithmetic and collectives. So it may import only torch, its
``distributed`` package and PyTorch's own DDP hooks, and a few pure modules of the standard library; it may not
name a private or special attribute (``_C``, ``__class__``, ``__globals__``: the ways out of an allowlist), call
the builtins that reach files, code or other objects (``open``, ``exec``, ``getattr``, ``globals`` ...), use torch's
doors to files, processes and the network (``torch.load``, ``torch.hub``, ``torch.multiprocessing`` ...), or assign
to a module's attribute (``dist.all_reduce = mine``: patching the collectives the byte counter wraps).

The screen is the first line, not the only one: what gets past it runs in :mod:`.sandbox`'s budget and folder, and
the probe's wire check sees bytes sent by any means it does not count.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

__all__ = ["Problem", "screen"]

#: Modules a submission may import (and their submodules where the entry ends with ``.*``).
ALLOWED_IMPORTS = (
    "torch",
    "torch.distributed",
    "torch.nn",
    "torch.nn.functional",
    "torch.distributed.algorithms.ddp_comm_hooks.*",
    "math",
    "functools",
    "itertools",
    "dataclasses",
    "typing",
    "collections",
    "__future__",
)

#: What importing a module of these families would be, in the issue's words.
_KINDS = {
    "forks or runs other processes": ("os", "subprocess", "multiprocessing", "signal", "pty", "posix", "threading",
                                       "concurrent", "resource"),
    "talks to the network": ("socket", "urllib", "http", "requests", "ssl", "asyncio", "ftplib", "smtplib",
                             "telnetlib", "xmlrpc", "selectors", "select", "websocket", "aiohttp"),
    "touches files outside its folder": ("pathlib", "shutil", "tempfile", "io", "glob", "fileinput", "pickle",
                                         "shelve", "sqlite3", "zipfile", "tarfile", "json", "csv"),
    "reaches into other code's objects (the probe's reference gradient, the byte counter)": (
        "gc", "inspect", "sys", "builtins", "importlib", "traceback", "ctypes", "cffi", "weakref", "types",
        "commhooks_lab", "numpy", "code", "pdb", "marshal", "runpy", "atexit",
    ),
}  # fmt: skip

#: Every module root named above: as an attribute (``torch.os``) it is the same module, reached another way.
_MODULE_ROOTS = {root for roots in _KINDS.values() for root in roots}

#: Builtins that open files, run code or reach any object's insides.
FORBIDDEN_NAMES = {
    "open": "touches files outside its folder",
    "exec": "runs code the screen has not read",
    "eval": "runs code the screen has not read",
    "compile": "runs code the screen has not read",
    "__import__": "imports past the screen",
    "getattr": "reaches attributes the screen cannot read",
    "setattr": "patches other code's objects",
    "delattr": "patches other code's objects",
    "globals": "reaches into other code's objects",
    "locals": "reaches into other code's objects",
    "vars": "reaches into other code's objects",
    "breakpoint": "stops for input",
    "input": "stops for input",
    "exit": "ends the process",
    "quit": "ends the process",
    "memoryview": "reaches raw memory",
}

#: torch's doors to files, processes, compiled code and the network (attribute names, wherever they appear).
FORBIDDEN_ATTRIBUTES = {
    "load": "touches files (torch.load)",
    "save": "touches files (torch.save)",
    "from_file": "touches files",
    "hub": "talks to the network (torch.hub)",
    "utils": "reaches torch.utils (cpp_extension compiles and runs code, data loaders start processes; "
    + "the screen reads names, not types, so torch.nn.utils is refused too)",
    "ops": "reaches compiled operators by name",
    "library": "defines compiled operators",
    "classes": "reaches compiled classes by name",
    "multiprocessing": "forks or runs other processes",
    "rpc": "talks to other processes (torch.distributed.rpc)",
    "elastic": "starts processes (torch.distributed.elastic)",
    "launcher": "starts processes",
    "run": "starts processes (torch.distributed.run)",
    "jit": "loads compiled code (torch.jit)",
    "package": "loads packaged code (torch.package)",
    "TCPStore": "talks to the network",
    "FileStore": "touches files",
    "HashStore": "reaches the ranks' rendezvous",
    "init_process_group": "makes its own process group",
    "destroy_process_group": "tears down the ranks' process group",
    "set_num_threads": "changes the ranks' numerics",
    "use_deterministic_algorithms": "changes the ranks' numerics",
    "manual_seed": "changes the course's seeds (the screen reads names, not types, so a private generator's is "
    + "refused too)",
    "environ": "reads the environment",
    "numpy": "leaves torch (a numpy array writes files: tofile, dump)",
    "tofile": "touches files",
    "dump": "touches files",
}


@dataclass(frozen=True)
class Problem:
    """One thing the screen refuses: where, what, and which kind of cheating it would be."""

    line: int
    what: str
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}: {self.why}"


def _allowed(module: str) -> bool:
    for entry in ALLOWED_IMPORTS:
        if entry.endswith(".*"):
            base = entry[:-2]
            if module == base or module.startswith(base + "."):
                return True
        elif module == entry:
            return True
    return False


def _kind(module: str) -> str:
    root = module.split(".")[0]
    for kind, roots in _KINDS.items():
        if root in roots:
            return kind
    return "is not among the modules a hook may import"


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def screen(source: str) -> list[Problem]:
    """Every problem in ``source``, in line order (an empty list: it may run)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [Problem(exc.lineno or 0, "a syntax error", str(exc.msg))]
    problems: list[Problem] = []
    imported: set[str] = set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported.add((alias.asname or alias.name).split(".")[0])
                if not _allowed(alias.name):
                    problems.append(Problem(line, f"import {alias.name}", _kind(alias.name)))
        elif isinstance(node, ast.ImportFrom):
            problems += _import_from(node, imported)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                problems.append(
                    Problem(
                        line,
                        f".{node.attr}",
                        "a private or special attribute: reaches other "
                        "code's objects (the probe, the byte counter, the reference gradient)",
                    )
                )
            elif node.attr in FORBIDDEN_ATTRIBUTES:
                problems.append(Problem(line, f".{node.attr}", FORBIDDEN_ATTRIBUTES[node.attr]))
            elif node.attr in _MODULE_ROOTS:  # torch.os, default_hooks.torch.sys: a module another module imported
                problems.append(Problem(line, f".{node.attr}", _named_like_a_module(node.attr)))
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                problems.append(Problem(line, node.id, FORBIDDEN_NAMES[node.id]))
            elif node.id.startswith("__") and node.id != "__name__":
                problems.append(Problem(line, node.id, "a special name: reaches other code's objects"))
        elif isinstance(node, ast.Global) and any(n.startswith("_") for n in node.names):
            problems.append(Problem(line, "global " + ", ".join(node.names), "a private name"))
    for node in ast.walk(tree):
        for target in _assigned(node):
            if isinstance(target, ast.Attribute | ast.Subscript) and _root_name(target) in imported:
                problems.append(Problem(getattr(node, "lineno", 0), f"assigns to {ast.unparse(target)}",
                                        "patches a library (the collectives the byte counter wraps)"))  # fmt: skip
    return sorted(set(problems), key=lambda p: (p.line, p.what))


def _named_like_a_module(attr: str) -> str:
    """Why ``x.select`` is refused: it may be the module (``torch.os``); the screen reads names, not types."""
    return (
        f"{_kind(attr)}, if it is the module {attr} reached through another one; the screen reads names, not types, "
        f"so any attribute named {attr} is refused (a tensor method too: find another way)"
    )


def _import_from(node: ast.ImportFrom, imported: set[str]) -> list[Problem]:
    """``from M import N``: M allowed and N neither private nor a door; or M.N itself an allowed module."""
    line, module = node.lineno, node.module or ""
    if node.level:
        return [Problem(line, f"a relative import (from {'.' * node.level}{module})", "imports past the screen")]
    problems = []
    for alias in node.names:
        imported.add(alias.asname or alias.name)
        what = f"from {module} import {alias.name}"
        if not _allowed(module) and not _allowed(f"{module}.{alias.name}"):
            problems.append(Problem(line, what, _kind(module)))
        elif alias.name.startswith("_") and module != "__future__":
            problems.append(Problem(line, what, "a private name: reaches other code's objects"))
        elif alias.name in FORBIDDEN_ATTRIBUTES or alias.name in _MODULE_ROOTS:
            problems.append(Problem(line, what, FORBIDDEN_ATTRIBUTES.get(alias.name) or _kind(alias.name)))
    return problems


def _assigned(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []
