"""The shape of the package: one registry that everything reads, no import cycles, a launcher
that never imports the engine, and old names that still work with a warning."""

import ast
import sys
from pathlib import Path

import pytest

import commhooks_lab as lab
from commhooks_lab import cli, registry
from commhooks_lab.compressors import Compressor

PACKAGE = Path(lab.__file__).parent


def toy_hook(state, bucket):
    """Halve, then average: a hook whose result differs from allreduce's in a way a test can see."""
    import torch.distributed as dist

    tensor = bucket.buffer().div_(2 * dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


@pytest.fixture
def toy_registered():
    entry = registry.register(
        registry.HookEntry("toy_half", registry.HOOK, "averages, then halves", build=lambda o, pg: (toy_hook, pg))
    )
    yield entry
    registry.unregister("toy_half")


def test_one_registration_reaches_every_place_that_offers_hooks(toy_registered):
    assert "toy_half" in set(lab.available_hooks()["name"])
    assert "toy_half" in _compare_help()
    args = cli.build_parser().parse_args(["compare", "--hooks", "toy_half", "fp16"])
    assert [c.hook for c in cli.comparison_configs(args)] == ["toy_half", "fp16"]
    board = lab.HookLab()
    try:
        assert "toy_half" in board.hook.options
        board.hook.value = "toy_half"
        assert board.options_box.children == ()
    finally:
        board.close()
    assert lab.ExperimentConfig(hook="toy_half").check().entry is toy_registered


def _compare_help() -> str:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["compare"].format_help()


def test_a_registered_hook_runs_in_the_ranks_and_is_measured(toy_registered):
    result = lab.run(hook="toy_half", steps=2)
    assert result.name == "toy_half"
    assert result.steps["rel_error"].iloc[-1] == pytest.approx(0.5, abs=1e-6)  # half the exact average


def test_registry_refuses_duplicates_and_malformed_entries():
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.HookEntry("fp16", registry.HOOK, "again", build=lambda o, pg: (None, pg)))
    with pytest.raises(ValueError, match="needs build="):
        registry.register(registry.HookEntry("broken", registry.HOOK, "no builder"))
    with pytest.raises(ValueError, match="unknown hook 'topkk'.*did you mean 'topk'"):
        registry.get("topkk")


def test_state_options_are_checked_from_the_registry():
    with pytest.raises(ValueError, match="unknown option 'ratoi' for topk; did you mean 'ratio'"):
        lab.ExperimentConfig(hook="topk", state_options={"ratoi": 0.1}).check()
    with pytest.raises(ValueError, match="TopK ratio must be in"):
        lab.ExperimentConfig(hook="topk", state_options={"ratio": 2.0}).check()
    with pytest.raises(ValueError, match="must be True or False"):
        lab.ExperimentConfig(hook="topk", state_options={"error_feedback": 1}).check()
    with pytest.raises(ValueError, match="keeps no state"):
        lab.ExperimentConfig(hook="fp16", state_options={"x": 1}).check()
    with pytest.raises(ValueError, match="makes its own payload"):
        lab.ExperimentConfig(hook="sign", wrapper="fp16").check()
    assert (
        lab.ExperimentConfig(hook="topk", state_options={"ratio": 0.05, "error_feedback": True}).name == "topk 5% + EF"
    )


def test_the_cli_offers_compressors_wrappers_and_the_accelerate_path():
    parser = cli.build_parser()
    args = parser.parse_args(
        [
            "compare",
            "--hooks",
            "topk[ratio=0.05,error_feedback=true]",
            "power_sgd[matrix_approximation_rank=2]",
            "allreduce",
            "--wrapper",
            "fp16",
            "--api",
            "torch",
        ]
    )
    configs = cli.comparison_configs(args)
    assert [c.name for c in configs] == ["topk 5% + EF", "fp16_wrapper(power_sgd r2)", "fp16_wrapper(allreduce)"]
    assert configs[0].wrapper == "no" and configs[1].state_options["start_powerSGD_iter"] == 2
    args = parser.parse_args(["compare", "--hooks", "power_sgd", "--matrix-rank", "1", "3", "--api", "accelerate"])
    assert [c.name for c in cli.comparison_configs(args)] == ["power_sgd r1", "power_sgd r3"]
    assert {c.api for c in cli.comparison_configs(args)} == {"accelerate"}
    with pytest.raises(ValueError, match="key=value"):
        registry.parse_hook_spec("topk[ratio]")


def test_the_old_matrix_rank_flag_still_works_with_a_warning(capsys):
    args = cli.build_parser().parse_args(["compare", "--hooks", "power_sgd", "--rank", "2"])
    assert args.deprecated_rank == [2]
    with pytest.raises(SystemExit):  # run main far enough to see the warning, then stop at a bad option
        cli.main(["--hooks", "power_sgd", "nope", "--rank", "2", "--out", ""])
    assert "--rank is now --matrix-rank" in capsys.readouterr().err


def test_probe_is_now_measure_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="now measure="):
        config = lab.ExperimentConfig(probe=False)
    assert config.measure is False and config.probe is None
    assert "probe" not in config.to_dict() and config.to_dict()["measure"] is False


def test_an_identity_compressor_as_a_hook_is_exact():
    result = lab.run(hook=Compressor(), steps=3)
    assert (result.steps["rel_error"] < 1e-6).all()
    assert (result.steps["rank_spread"] == 0).all()


# -- the import graph -------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Package module -> package modules it imports anywhere (function-level imports included)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            edges |= {t for t in targets if t in modules and t != name}
        # a module's own parent packages are imported before it anyway: those edges are not cycles
        graph[name] = {t for t in edges if not name.startswith(t + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    # the top-level __init__ resolves names lazily (importlib), so it has no static edges to follow
    assert "commhooks_lab.registry" in graph["commhooks_lab.hooks"]  # the walker sees real edges
    assert "commhooks_lab.ddp_setup" in graph["commhooks_lab.accelerate_path"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_launcher_never_imports_the_engine():
    graph = import_graph()
    launcher = {m for m in graph if m.startswith("commhooks_lab.launcher")}
    assert len(launcher) >= 7
    outside = {(m, t) for m in launcher for t in graph[m] if not t.startswith("commhooks_lab.launcher")}
    assert not outside, f"launcher modules import the engine: {sorted(outside)}"


def test_importing_the_launcher_loads_no_engine_module():
    """As a rank sees it: no prewarm there (in a notebook, importing the package also loads the
    engine on a background thread, on purpose)."""
    import os
    import subprocess

    code = "import sys, commhooks_lab.launcher; print(sorted(m for m in sys.modules if m.startswith('commhooks_lab')))"
    env = {**os.environ, "COMMHOOKS_LAB_PREWARM": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    loaded = ast.literal_eval(out)
    package = ("commhooks_lab", "commhooks_lab._prewarm")
    assert all(m in package or m.startswith("commhooks_lab.launcher") for m in loaded), loaded


def test_one_version_source():
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    from importlib.metadata import version

    assert version("commhooks_lab") == lab.__version__
