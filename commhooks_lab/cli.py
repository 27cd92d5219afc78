"""``python -m commhooks_lab``: compare DDP communication hooks and print what each one costs.

Runs in a terminal (it starts the ranks itself) or under torchrun (the ranks are given).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .challenge.tasks import TASK_SET, TASK_SETS
from .hooks.powersgd import SHORT_RUN_START
from .launcher.rank_server import DEFAULT_START_METHOD
from .launcher.torchrun import launch_from_env, under_torchrun

__all__ = ["build_parser", "comparison_configs", "main"]


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import main as doctor_main

    return doctor_main()


def _selfcheck(args: argparse.Namespace) -> int:
    from .launcher.allreduce_check import allreduce_rank_plus_one, selfcheck, summarize

    if under_torchrun():
        rows = launch_from_env(allreduce_rank_plus_one)
        if rows is None:  # not rank 0: rank 0 reports
            return 0
        report = summarize(rows, len(rows))
    else:
        report = selfcheck(world_size=args.world_size, start_method=args.start_method)
    print(
        f"self-check: {report['world_size']} ranks ({report['backend']}) all-reduced rank+1; "
        f"every rank holds {report['sums']}, expected {report['expected']:g}: "
        f"{'OK' if report['ok'] else 'MISMATCH'}"
    )
    return 0 if report["ok"] else 1


def comparison_configs(args: argparse.Namespace):
    """One config per hook spec; PowerSGD variants once per ``--matrix-rank`` unless the spec sets it."""
    from .engine.config import ExperimentConfig
    from .experiment import DEFAULT_COMPARISON, as_config
    from .hooks import registry

    base = ExperimentConfig(
        model=args.model,
        world_size=args.world_size,
        steps=args.steps,
        seed=args.seed,
        batch_size=args.batch_size,
        wrapper=args.wrapper,
        api=args.api,
        link=args.link,
        nodes=args.nodes,
        intra_link=args.intra_link,
        timing=args.timing,
        measure=not args.timing,
    )
    if not args.hooks:
        return [as_config(item, base) for item in DEFAULT_COMPARISON]
    configs = []
    for spec in args.hooks:  # a name, "name[key=value,...]" or module:function (a hook of your own)
        config = base.replace(hook=spec)
        entry = registry.get(config.hook) if isinstance(config.hook, str) and ":" not in config.hook else None
        if entry is None:
            configs.append(config)
            continue
        if entry.kind == registry.COMPRESSOR:
            configs.append(config.replace(wrapper="no"))
        else:
            configs += _per_matrix_rank(config, entry, args)
    return configs


#: The option ``--matrix-rank`` sweeps: a hook that takes it (PowerSGD's) runs once per value unless its spec sets it.
SWEPT = "matrix_approximation_rank"


def _per_matrix_rank(config, entry, args: argparse.Namespace) -> list:
    """``config`` once per ``--matrix-rank`` if its hook takes a matrix rank, from ``--start-iter`` if given,
    else from the record's short-run start (the lab's short runs: PowerSGD compresses from step 2)."""
    if SWEPT not in entry.defaults():
        return [config]
    start = {} if args.start_iter is None else {"start_powerSGD_iter": args.start_iter}
    options = entry.short_run_options({**start, **config.state_options})
    given = options.pop(SWEPT, None)
    ranks = args.matrix_rank if given is None else [given]
    return [config.replace(state_options={SWEPT: r, **options}) for r in ranks]


#: What the comparison writes into ``--out``: each is the lab's, so a link or a FIFO planted there is refused.
OUT_NAMES = ("results", "summary.csv", "overview.png")


def _check_out(out: Path) -> None:
    """Refuse an ``--out`` the results could not be written to before the comparison runs, not after; a link
    where the lab writes inside it (a run folder handed around) would send the files elsewhere."""
    for name in OUT_NAMES:
        if (out / name).is_symlink() or (out / name).exists() and not ((out / name).is_file() or name == "results"):
            raise ValueError(
                f"--out {out}: {out / name} is a link or not a file; the lab writes its own {name} there. Remove it, "
                "or give another --out"
            )
    try:
        (out / "results").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ValueError(
            f"--out {out}: cannot write the results there ({exc.strerror or exc}): give a folder you can write to, "
            "or --out '' for none"
        ) from None


def _compare(args: argparse.Namespace) -> int:
    from .experiment import compare

    configs = comparison_configs(args)
    if args.out:
        _check_out(Path(args.out))
    # in a terminal the lab starts the ranks; under torchrun they are given (world size included) and
    # compare runs every config in their one process group, rank 0 reporting
    results = compare(configs, progress=not args.quiet)
    if results is None:  # a torchrun rank other than 0
        return 0
    first = results[0].config
    print(f"\n{len(results)} hooks, {first['world_size']} ranks, {first['steps']} steps of {results[0].env['task']}\n")
    print(results.table(formatted=True).to_string())
    notes = results.notes()
    if notes:
        print("\nnotes:")
        for note in dict.fromkeys(notes):
            print(f"- {note}")
    if args.out:
        out = Path(args.out)
        results.save(out / "results")
        results.table().to_csv(out / "summary.csv")
        if not args.no_figure:
            import matplotlib

            matplotlib.use("Agg")
            from .plots import overview

            figure = overview(results)
            figure.savefig(out / "overview.png", dpi=110)
            print(
                f"\nwrote {out / 'summary.csv'}, {out / 'overview.png'} and {len(results)} results in "
                f"{out / 'results'} (commhooks_lab.load reads them)"
            )
    return 0


_MEASURED_HELP = (
    "also time each task behind a real link of this rate (1gbit, 100mbit; needs user namespaces), beside "
    "all-reduce: shown with the score, never part of it"
)


_TASK_SET_HELP = (
    f"the tasks (default {TASK_SET}; hook-challenge-nodes-1 adds the wide MLP on 2 nodes of 2 ranks): scores "
    "compare only within one set"
)


def _challenge_score(args: argparse.Namespace) -> int:
    from .challenge.sandbox import score_file

    scored = score_file(args.file, tasks=args.task_set, link=args.link)
    print(scored.report())
    print(f"  isolation: {scored.versions.get('isolation', '')}")
    return 0 if scored.value is not None else 1


def _challenge_leaderboard(args: argparse.Namespace) -> int:
    from .challenge.leaderboard import leaderboard

    page = leaderboard(
        args.dir,
        out=args.out,
        tasks=args.task_set,
        baselines=not args.no_baselines,
        link=args.link,
        rank_python=args.rank_python,
    )
    print(f"wrote {page}")
    return 0


def _notebooks(args) -> int:
    from .course import copy_course

    done = copy_course(args.dir, force=args.force, lang=args.lang)
    print(done.summary())
    return 1 if done.kept else 0


def build_parser() -> argparse.ArgumentParser:
    from .hooks import registry

    parser = argparse.ArgumentParser(prog="python -m commhooks_lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    comp = sub.add_parser("compare", help="compare hooks on one task (the default)")
    comp.add_argument(
        "--hooks",
        nargs="+",
        metavar="HOOK",
        help="registered names, with state options in brackets where wanted, e.g. fp16 "
        "'topk[ratio=0.05,error_feedback=true]' 'power_sgd[matrix_approximation_rank=2]', or "
        f"module:function (default: the main job's line-up). Registered: "
        f"{', '.join(registry.hook_names())}",
    )
    comp.add_argument(
        "--wrapper",
        default="no",
        choices=registry.wrapper_names(),
        help="wrap every PyTorch hook (fp16_compress_wrapper, bf16_compress_wrapper)",
    )
    comp.add_argument(
        "--api",
        default="torch",
        choices=["torch", "accelerate"],
        help="register through PyTorch, or through Accelerate's DistributedDataParallelKwargs",
    )
    comp.add_argument(
        "--matrix-rank",
        type=int,
        nargs="+",
        default=[1, 4],
        help="PowerSGD's matrix_approximation_rank values (the r of P Q^T, not a process rank)",
    )
    comp.add_argument(
        "--start-iter",
        type=int,
        default=None,
        help=f"PowerSGD start_powerSGD_iter, with --hooks (default: the lab's short-run start, {SHORT_RUN_START})",
    )
    comp.add_argument("--model", default="mlp", help="mlp | cnn | lowrank | module:function")
    comp.add_argument("--world-size", type=int, default=2)
    comp.add_argument("--steps", type=int, default=20)
    comp.add_argument("--batch-size", type=int, default=32)
    comp.add_argument("--seed", type=int, default=0)
    comp.add_argument(
        "--link",
        default=None,
        help="every rank behind a network link of its own, e.g. 100mbit, 1gbit, 10mbit (default: this machine's "
        "loopback); the table then shows each hook's median step time. With --nodes: each node's one uplink",
    )
    comp.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="group the ranks into this many nodes (consecutive ranks, a fast switch inside each), each reaching "
        "the others through one uplink at --link's rate, shared by its ranks",
    )
    comp.add_argument(
        "--intra-link", default=None, help="with --nodes: each rank's link inside its node (default: none)"
    )
    comp.add_argument(
        "--timing",
        action="store_true",
        help="time DDP's own overlap: hooks run as registered, without the probe's float64 error measurement",
    )
    comp.add_argument("--out", default="runs/latest", help="folder for the table, figure and results ('' for none)")
    comp.add_argument("--no-figure", action="store_true")
    comp.add_argument("--quiet", action="store_true", help="no progress bar")
    comp.set_defaults(func=_compare)
    check = sub.add_parser("selfcheck", help="start ranks, all-reduce, check that they agree")
    check.add_argument("--world-size", type=int, default=2)
    check.add_argument(
        "--start-method", default=DEFAULT_START_METHOD, help="forkserver (the rank server), spawn or fork"
    )
    check.set_defaults(func=_selfcheck)
    doctor = sub.add_parser("doctor", help="preflight a workshop laptop: a pass/fail table with what to do")
    doctor.set_defaults(func=_doctor)
    challenge = sub.add_parser("challenge", help="the hook challenge: score a hook, build the leaderboard")
    challenge_sub = challenge.add_subparsers(dest="challenge_command", required=True)
    score = challenge_sub.add_parser(
        "score", help="score the hook in FILE (.py, or a notebook's cells tagged challenge)"
    )
    score.add_argument("file", metavar="FILE")
    score.add_argument("--link", default=None, help=_MEASURED_HELP)
    score.add_argument("--task-set", default=TASK_SET, choices=list(TASK_SETS), help=_TASK_SET_HELP)
    score.set_defaults(func=_challenge_score)
    board = challenge_sub.add_parser("leaderboard", help="re-run every submission in DIR and write an HTML page")
    board.add_argument("dir", metavar="DIR")
    board.add_argument("--out", default=None, help="the page's path (default: DIR/leaderboard.html)")
    board.add_argument("--no-baselines", action="store_true", help="leave the lab's reference hooks off the page")
    board.add_argument("--link", default=None, help=_MEASURED_HELP)
    board.add_argument("--task-set", default=TASK_SET, choices=list(TASK_SETS), help=_TASK_SET_HELP)
    board.add_argument(
        "--rank-python",
        default=None,
        metavar="EXECUTABLE",
        help="spawn every run's ranks with this interpreter, e.g. a script that execs qemu-x86_64 -cpu Haswell-v4 "
        "python: the page made on another CPU, to compare with this one's",
    )
    board.set_defaults(func=_challenge_leaderboard)
    notebooks = sub.add_parser("notebooks", help="copy the course (notebooks, glossary, teaching notes) into DIR")
    notebooks.add_argument("dir", metavar="DIR", help="folder for the course (made if missing)")
    notebooks.add_argument("--force", action="store_true", help="replace notebooks you edited with the course's")
    notebooks.add_argument(
        "--lang",
        default=None,
        help="the notebooks and glossary in this language (ko: 한국어), code and outputs as in English",
    )
    notebooks.set_defaults(func=_notebooks)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["compare", *argv]
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as exc:
        parser.exit(2, f"error: {exc}\n")
