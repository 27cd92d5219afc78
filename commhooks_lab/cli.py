"""``python -m commhooks_lab``: the README's main job, in a terminal or under torchrun."""
from __future__ import annotations

import argparse
import sys

from .torchrun import launch_from_env, under_torchrun


def _selfcheck(args: argparse.Namespace) -> int:
    from .selfcheck import allreduce_rank_plus_one, selfcheck, summarize

    if under_torchrun():
        rows = launch_from_env(allreduce_rank_plus_one)
        if rows is None:  # not rank 0: rank 0 reports
            return 0
        report = summarize(rows, len(rows))
    else:
        report = selfcheck(world_size=args.world_size, start_method=args.start_method)
    print(f"self-check: {report['world_size']} ranks ({report['backend']}) all-reduced rank+1; "
          f"every rank holds {report['sums']}, expected {report['expected']:g}: "
          f"{'OK' if report['ok'] else 'MISMATCH'}")
    return 0 if report["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m commhooks_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    check = sub.add_parser("selfcheck", help="start ranks, all-reduce, check that they agree")
    check.add_argument("--world-size", type=int, default=2)
    check.add_argument("--start-method", default="spawn")
    check.set_defaults(func=_selfcheck)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["selfcheck", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)
