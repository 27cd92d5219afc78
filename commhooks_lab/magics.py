"""``%load_ext commhooks_lab``: run notebook cells on the kernel's warm ranks.

- ``%ddp start [-n 2] [--timeout 30] [--link 100mbit] [--nodes 2] [--intra-link 10gbit]``: start (or join) the
  session's warm ranks, the ones ``lab.run`` uses (with ``--link``, each behind a link of its own:
  :mod:`commhooks_lab.launcher.link_spec`; with ``--nodes``, in nodes whose one uplink each is ``--link``:
  :mod:`commhooks_lab.launcher.topology`);
- ``%%ddp [--rank 0[,1...]] [--timeout S] [--measure]``: run the cell on every rank (or those), each in a namespace
  of its own that persists between cells, with ``torch``, ``dist`` (initialised), ``ctx``, ``rank`` and
  ``world_size`` set. ``--measure`` (every rank): a hook registered in the cell runs inside the lab's probe, each
  backward through its model is a step, and after the cell rank 0 shows every step recorded so far, measured as
  ``lab.run`` measures (``rel_error``, ``cosine``, ``rank_spread``, bytes); ``measured`` holds them (a DataFrame).
  Output is labelled by rank, and ranks that print the same are shown once. A rank whose cell raises prints its
  traceback, named, and the cell fails; every namespace is kept (a ``SyntaxError`` or ``sys.exit()`` too;
  ``os.fork()`` is refused). Only a cell that destroys the process group restarts the ranks, and says so. A cell
  that hangs (a collective some rank never joins) ends with the launcher's ``WorkerTimeoutError``, ``--timeout`` S
  plus about 5 s after the ranks' last sign of life (``WATCHDOG_MARGIN_S``: gloo's own timeout gets to report
  first); that, and an interrupt (Ctrl-C), stop the ranks, so their namespaces are gone and the next cell starts
  fresh ones;
- ``%ddp push NAME ...`` / ``%ddp pull NAME [--rank R]``: copy picklable values into every rank / back (a list in
  rank order, or rank R's value);
- ``%ddp reset`` forgets the namespaces (the ranks stay); ``%ddp stop`` stops the ranks; ``%ddp status``.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

__all__ = ["DDPCellError", "format_outputs", "load_ipython_extension", "measured_cell"]


class DDPCellError(RuntimeError):
    """A ``%%ddp`` cell raised on some ranks (their tracebacks were printed above, each named)."""


def format_outputs(rows: list[dict]) -> str:
    """What the ranks printed (and their last values), each text once, headed by the ranks that printed it."""
    groups: dict[str, list[int]] = {}
    for row in rows:
        if row.get("skipped"):
            continue
        text = row["out"] + (row["value"] + "\n" if row.get("value") is not None else "")
        if row["error"] is None and text:
            groups.setdefault(text, []).append(row["rank"])
    parts = []
    for text, ranks in groups.items():
        label = f"[rank {ranks[0]}]" if len(ranks) == 1 else f"[ranks {', '.join(map(str, ranks))}]"
        parts.append(f"{label}\n{text}")
    for row in rows:
        if not row.get("skipped") and row["error"] is not None:
            parts.append(f"[rank {row['rank']}] {row['out']}{row['error']}")
    return "".join(parts)


class _Parser(argparse.ArgumentParser):
    """argparse that raises IPython's UsageError (a one-line message) where it would exit the kernel's
    process with ``SystemExit: 2``, even with ``exit_on_error=False`` (unknown options, missing values)."""

    def error(self, message: str):
        from IPython.core.error import UsageError

        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


def _parse(parser: argparse.ArgumentParser, words: list[str], *, names: bool = False) -> tuple:
    """The options (and, with ``names``, the other words); a bad or unknown option is a UsageError."""
    try:
        options, rest = parser.parse_known_args(words)
    except argparse.ArgumentError as exc:
        parser.error(str(exc))
    unknown = [w for w in rest if w.startswith("-")] if names else rest
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return options, rest


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, add_help=False, exit_on_error=False)
    parser.add_argument("--rank", default=None, help="ranks to run on: 0 or 0,2")
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--measure", action="store_true", help="probe hooks registered in the cell")
    return parser


def measured_cell(ctx, code: str, key: str = "ddp") -> dict:
    """A rank's side of ``%%ddp --measure``: the cell with its new hooks probed, then every recorded step measured.

    Measuring communicates, so it runs only if the cell raised on no rank (the ranks agree on that first).
    """
    import pandas as pd
    import torch
    import torch.distributed as dist

    from .launcher.cells import namespace, run_cell
    from .measure.hand_hooks import COLUMNS, measure_steps, probing

    ns = namespace(ctx, key)
    probes = ns.setdefault("__probes__", [])  # %ddp reset forgets them with the namespace
    with probing(ctx, probes):
        row = run_cell(ctx, code, None, key)
    if row["restart"]:  # no process group left to agree in
        return row
    failed = torch.tensor([row["error"] is not None], dtype=torch.int32)
    dist.all_reduce(failed)
    if failed.item():
        return row
    table = measure_steps(probes)
    if table is not None:
        earlier = ns.get("measured")
        ns["measured"] = table if earlier is None else pd.concat([earlier, table], ignore_index=True)
        shown = table[COLUMNS].to_string(index=False, float_format="{:.3g}".format)
        row["out"] += f"measured by the lab's probe (rank 0 keeps every step in `measured`):\n{shown}\n"
    return row


#: Above this, ``%ddp push`` says what a push costs (it pickles the values through each rank's pipe).
LARGE_PUSH_BYTES = 256 << 20


def _nbytes(value: Any) -> int:
    """The bytes of a tensor's or an array's data (what dominates a push), else 0: no value is pickled to find out."""
    if hasattr(value, "nbytes") and isinstance(value.nbytes, int):  # numpy arrays, torch tensors
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def _warn_if_large(values: dict[str, Any]) -> None:
    import warnings

    size = sum(_nbytes(v) for v in values.values())
    if size > LARGE_PUSH_BYTES:
        warnings.warn(
            f"%ddp push of {size / 2**20:,.0f} MiB: it is pickled through each rank's pipe, tens of seconds per GiB "
            "and about twice its size more memory in the kernel and in each rank; for data that large, save it to a "
            "file (torch.save) and load it in a %%ddp cell",
            RuntimeWarning,
            stacklevel=3,
        )


def _ranks(text: str | None, world_size: int) -> list[int] | None:
    from IPython.core.error import UsageError

    if text is None:
        return None
    try:
        ranks = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise UsageError(f"--rank {text}: give rank numbers, 0 or 0,2 (ranks are 0..{world_size - 1} here)") from None
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad or not ranks:
        raise UsageError(f"--rank {text}: ranks are 0..{world_size - 1} here")
    return ranks


class _DDP:
    """The magics' state: which warm ranks they use."""

    def __init__(self, shell: Any):
        self.shell = shell
        self._spec: Any = None  # the RankSpec of `%ddp start` (made on first use: 2 ranks)

    @property
    def spec(self):
        if self._spec is None:
            from .launcher import RankSpec

            self._spec = RankSpec()
        return self._spec

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def cluster(self):
        from .launcher import Ranks

        return Ranks()(self.spec)  # the session's warm ranks, the ones lab.run uses

    def line(self, line: str) -> Any:
        words = shlex.split(line)
        command, rest = (words[0], words[1:]) if words else ("status", [])
        if command == "start":
            from .launcher import RankSpec
            from .launcher.options import DEFAULT_TIMEOUT_S

            parser = _Parser(prog="%ddp start", add_help=False, exit_on_error=False)
            parser.add_argument("-n", type=int, default=2)
            parser.add_argument("--timeout", type=float, default=None)
            parser.add_argument("--link", default=None, help="each rank behind a link of its own: 100mbit, 1gbit")
            parser.add_argument("--nodes", type=int, default=1, help="ranks in nodes; --link is each node's uplink")
            parser.add_argument("--intra-link", default=None, help="with --nodes: each rank's link inside its node")
            started, _ = _parse(parser, rest)
            timeout_s = DEFAULT_TIMEOUT_S if started.timeout is None else started.timeout
            self._spec = RankSpec(  # refused before it is kept
                started.n, timeout_s=timeout_s, link=started.link, nodes=started.nodes, intra_link=started.intra_link
            )
            cluster = self.cluster()
            cluster.start()
            behind = f", each behind a {cluster.spec.link.spec} link" if cluster.spec.link is not None else ""
            if cluster.spec.topology is not None:
                behind = f", on {cluster.spec.topology.spec}"
            print(f"{cluster.world_size} ranks ready (backend {cluster.backend}{behind}); run cells with %%ddp")
            return None
        if command == "stop":
            from .launcher import session

            session.close()
            print("ranks stopped")
            return None
        if command == "status":
            from .launcher import session

            running = [c for c in session.active() if c.spec == self.spec]
            print(f"{self.world_size} ranks {'running' if running else 'not started'}")
            return None
        if command == "reset":
            from .launcher.cells import reset

            self.cluster().run(reset)
            print("namespaces cleared on every rank")
            return None
        if command == "push":
            from .launcher.cells import push

            missing = [name for name in rest if name not in self.shell.user_ns]
            if missing:
                raise NameError(f"%ddp push: not defined in the kernel: {', '.join(missing)}")
            values = {name: self.shell.user_ns[name] for name in rest}
            _warn_if_large(values)
            self.cluster().run(push, values)
            return None
        if command == "pull":
            from .launcher.cells import MISSING, pull

            options, names = _parse(_parser("%ddp pull"), rest, names=True)
            ranks = _ranks(options.rank, self.world_size)
            rows = self.cluster().run(pull, names, ranks)
            absent = {r: row[MISSING] for r, row in enumerate(rows) if MISSING in row}
            if absent:  # the ranks and their namespaces stay
                said = "; ".join(f"rank {r}: {', '.join(lacking)}" for r, lacking in absent.items())
                raise NameError(f"%ddp pull: not defined on the ranks ({said})")
            for name in names:
                self.shell.user_ns[name] = rows[ranks[0]][name] if ranks else [row[name] for row in rows]
            return None
        raise ValueError(f"%ddp {command}: use start, stop, status, reset, push, pull (or %%ddp for a cell)")

    def cell(self, line: str, cell: str) -> None:
        from .launcher.cells import run_cell

        args, _ = _parse(_parser("%%ddp"), shlex.split(line))
        ranks = _ranks(args.rank, self.world_size)
        if args.measure and ranks is not None:
            raise ValueError("%%ddp --measure runs on every rank (measuring communicates): drop --rank")
        if args.measure:
            rows = self.cluster().run(measured_cell, cell, timeout_s=args.timeout)
        else:
            rows = self.cluster().run(run_cell, cell, ranks, timeout_s=args.timeout)
        text = format_outputs(rows)
        if text:
            print(text, end="" if text.endswith("\n") else "\n")
        failed = [row["rank"] for row in rows if not row.get("skipped") and row["error"] is not None]
        if any(row.get("restart") for row in rows):
            from .launcher import session

            session.close()  # the next cell or run starts ranks with a process group
            raise DDPCellError("the cell destroyed the ranks' process group; they were stopped (traceback above)")
        if failed:
            names = ", ".join(str(r) for r in failed)
            raise DDPCellError(f"the cell raised on rank{'s' if len(failed) > 1 else ''} {names} (traceback above)")


def load_ipython_extension(shell: Any) -> None:
    """Register ``%ddp`` and ``%%ddp`` (``%load_ext commhooks_lab``)."""
    state = _DDP(shell)

    def ddp(line: str, cell: str | None = None) -> Any:
        return state.line(line) if cell is None else state.cell(line, cell)

    ddp.__doc__ = __doc__
    shell.register_magic_function(ddp, magic_kind="line_cell", magic_name="ddp")
