"""The shape of the package: one registry that everything reads, no import cycles, and layers that only ever
import downwards (launcher < hooks < measure < engine < the notebook API < studies < plots, widgets, CLI)."""

import ast
import sys
from pathlib import Path

import pytest

import commhooks_lab as lab
from commhooks_lab import cli
from commhooks_lab.hooks import registry
from commhooks_lab.hooks.choice import parse_spec
from commhooks_lab.hooks.compressors import Compressor
from commhooks_lab.hooks.traffic import allreduced, numel

PACKAGE = Path(lab.__file__).parent


def toy_hook(state, bucket):
    """Divide, then average: a hook whose result differs from allreduce's in a way a test can see."""
    import torch.distributed as dist

    tensor = bucket.buffer().div_(state["divide"] * dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def toy_traffic(shapes, buckets, options):
    return allreduced(4 * sum(numel(s) for s in shapes), buckets)


@pytest.fixture
def toy_registered():
    """A hook with one state option, a byte rule and overlap: every fact in its one record."""
    entry = registry.register(
        registry.HookEntry(
            "toy_half",
            registry.HOOK,
            "divides by `divide`, then averages",
            build=lambda options, pg: (toy_hook, {"divide": 2.0, **options}),
            defaults=lambda: {"divide": 2.0},
            traffic=toy_traffic,
            overlaps_backward=True,
        )
    )
    yield entry
    registry.unregister("toy_half")


def test_one_registration_reaches_every_place_that_offers_hooks(toy_registered):
    availability = lab.available_hooks().set_index("name")
    assert availability.loc["toy_half", "what_it_does"] == "divides by `divide`, then averages"
    assert "toy_half" in _compare_help()
    args = cli.build_parser().parse_args(["compare", "--hooks", "toy_half[divide=4.0]", "fp16"])
    configs = cli.comparison_configs(args)
    assert [(c.hook, c.state_options) for c in configs] == [("toy_half", {"divide": 4.0}), ("fp16", {})]
    board = lab.HookLab()
    try:
        assert "toy_half" in board.hook.options
        board.hook.value = "toy_half"
        assert [(c.description, c.value) for c in board.options_box.children] == [("divide", 2.0)]
        assert board.config().state_options == {"divide": 2.0}
    finally:
        board.close()
    assert lab.ExperimentConfig(hook="toy_half[divide=3]").check().entry is toy_registered
    assert lab.network.rule_traffic([(3, 4), (4,)], "toy_half")["allreduce_bytes"] == 64
    assert "toy_half" in lab.network.ASYNCHRONOUS and "power_sgd" not in lab.network.ASYNCHRONOUS
    with pytest.raises(ValueError, match="no byte rule for hook 'ring16'"):
        lab.network.rule_traffic([(3, 4)], "ring16")


def _compare_help() -> str:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["compare"].format_help()


def test_a_registered_hook_runs_from_a_spec_and_follows_its_byte_rule(toy_registered):
    halved, quartered = lab.compare(["toy_half", "toy_half[divide=4.0]"], steps=3)
    assert halved.name == quartered.name == "toy_half" and quartered.config["state_options"] == {"divide": 4.0}
    assert halved.steps["rel_error"].iloc[-1] == pytest.approx(0.5, abs=1e-6)  # half the exact average
    assert quartered.steps["rel_error"].iloc[-1] == pytest.approx(0.75, abs=1e-6)
    shapes = lab.network.parameter_shapes(lab.models.build_task("mlp", 0).model)
    measured = {k: v for k, v in lab.network.traffic(halved).items() if k != "overlaps_backward"}
    assert measured == {k: v for k, v in toy_traffic(shapes, 1, {}).items()}
    assert lab.network.traffic(halved)["overlaps_backward"] is True


def test_compare_takes_the_same_specs_as_the_command_line():
    (run,) = lab.compare(["topk[ratio=0.05,error_feedback=true]"], steps=2, measure=False)
    assert run.config["hook"] == "topk" and run.config["state_options"] == {"ratio": 0.05, "error_feedback": True}
    with pytest.raises(ValueError, match="say each option once"):
        lab.ExperimentConfig(hook="topk[ratio=0.05]", state_options={"ratio": 0.1})


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
        parse_spec("topk[ratio]")


def test_no_deprecated_names_remain():
    """A 0.1 release carries no shims: the old spellings are errors, not warnings."""
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["compare", "--hooks", "power_sgd", "--rank", "2"])
    with pytest.raises(TypeError):
        lab.ExperimentConfig(probe=False)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        lab.plots.singular_values(None, ranks=(1,))  # type: ignore[call-arg, arg-type]


def test_an_identity_compressor_as_a_hook_is_exact():
    result = lab.run(hook=Compressor(), steps=3)
    assert (result.steps["rel_error"] < 1e-6).all()
    assert (result.steps["rank_spread"] == 0).all()


# -- the import graph -------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(replaced: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Package module -> package modules it imports anywhere (function-level imports included, and modules named
    as strings, for importlib); ``replaced``: module -> source to read instead of its file."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        source = (replaced or {}).get(name) or path.read_text()
        for node in ast.walk(ast.parse(source)):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                targets = [node.value]  # a module named for importlib (or a preload list) is imported all the same
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
    assert "commhooks_lab.hooks.registry" in graph["commhooks_lab.hooks.choice"]  # the walker sees real edges
    assert "commhooks_lab.engine.ddp_setup" in graph["commhooks_lab.engine.accelerate"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


#: Each layer, and what it may import besides itself (the README's "Where things live" draws the same).
LAYERS = {
    "launcher": set(),
    "_compat": set(),
    "_util": set(),
    "safe_files": set(),
    "hooks": {"_compat", "_util"},
    "measure": {"hooks", "_compat", "_util"},
    "engine": {"launcher", "hooks", "measure", "_compat", "_util", "safe_files"},
    "result": {"safe_files"},
    "course": {"safe_files"},
    "experiment": {"launcher", "hooks", "measure", "engine", "result", "_compat", "_util", "safe_files"},
    "studies": {
        "launcher",
        "hooks",
        "measure",
        "engine",
        "experiment",
        "result",
        "_compat",
        "_util",
        "safe_files",
        "course",
    },
}
#: The challenge scores with the notebook API and the studies' network model; the CLI imports it.
LAYERS["challenge"] = (LAYERS["studies"] - {"course"}) | {"studies"}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "commhooks_lab"


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (m, t)
        for m, targets in graph.items()
        if _layer(m) in LAYERS
        for t in targets
        if _layer(t) != _layer(m) and _layer(t) not in LAYERS[_layer(m)]
    )


def test_every_layer_imports_only_the_layers_below_it():
    graph = import_graph()
    layers = {_layer(m) for m in graph}
    assert set(LAYERS) <= layers, f"layers without modules: {set(LAYERS) - layers}"
    assert layer_violations(graph) == []


def test_the_layer_rule_has_teeth():
    graph = import_graph()
    graph["commhooks_lab.hooks.registry"] = graph["commhooks_lab.hooks.registry"] | {"commhooks_lab.engine.ddp_job"}
    job = "commhooks_lab.engine.ddp_job"
    graph[job] = graph[job] | {"commhooks_lab.studies.compile_matrix"}
    assert layer_violations(graph) == [
        ("commhooks_lab.engine.ddp_job", "commhooks_lab.studies.compile_matrix"),
        ("commhooks_lab.hooks.registry", "commhooks_lab.engine.ddp_job"),
    ]


def test_a_module_named_as_a_string_counts_as_an_import():
    """prewarm once named the engine and the notebook API as strings for importlib: the launcher imported them,
    and the layer rule, which read only import statements, did not see it."""
    before = "import importlib\n\nKERNEL_MODULES = ('commhooks_lab.experiment',)\n"
    before += "RANK_MODULES = ('numpy', 'commhooks_lab.engine.dispatch')\n"
    graph = import_graph({"commhooks_lab.launcher.prewarm": before})
    assert ("commhooks_lab.launcher.prewarm", "commhooks_lab.experiment") in layer_violations(graph)
    assert ("commhooks_lab.launcher.prewarm", "commhooks_lab.engine.dispatch") in layer_violations(graph)


#: Only the launcher decides where ranks come from (``launcher.ranks.Ranks``): a module above it that starts a
#: Cluster, wraps a cluster in ``nullcontext`` or asks the session itself has a policy of its own.
RANK_POLICY_CALLS = {"Cluster", "nullcontext", "get_cluster"}


def rank_policies(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """(module, line, call) for each call outside the launcher that decides where ranks come from."""
    found = []
    for name, source in sources.items():
        if _layer(name) == "launcher":
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called == "nullcontext" and not any("cluster" in ast.unparse(a) for a in node.args):
                continue  # nullcontext() for something else than ranks
            if called in RANK_POLICY_CALLS:
                found.append((name, node.lineno, called))
    return sorted(found)


def _sources() -> dict[str, str]:
    return {_module_name(p): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_only_the_launcher_decides_where_ranks_come_from():
    assert rank_policies(_sources()) == []


def test_the_rank_policy_rule_has_teeth():
    """The shape the seven places had before issue 53: each would be found."""
    study = (
        "import contextlib\nfrom ..launcher import Cluster, session\n"
        "def table(cluster=None):\n"
        "    with Cluster(world_size=2) if cluster is None else contextlib.nullcontext(cluster) as ranks:\n"
        "        return ranks\n"
        "def warm():\n    return session.get_cluster(2)\n"
        "def other():\n    return contextlib.nullcontext()\n"
    )
    assert rank_policies({"commhooks_lab.studies.made_up": study}) == [
        ("commhooks_lab.studies.made_up", 4, "Cluster"),
        ("commhooks_lab.studies.made_up", 4, "nullcontext"),
        ("commhooks_lab.studies.made_up", 7, "get_cluster"),
    ]
    assert rank_policies({"commhooks_lab.launcher.ranks": study}) == []


def test_at_most_a_dozen_modules_at_the_top_level():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    assert all((p / "__init__.py").exists() for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")


def test_importing_the_launcher_loads_no_engine_module():
    """As a rank sees it: no prewarm there (in a notebook, importing the package also loads the
    engine on a background thread, on purpose)."""
    import os
    import subprocess

    code = "import sys, commhooks_lab.launcher; print(sorted(m for m in sys.modules if m.startswith('commhooks_lab')))"
    env = {**os.environ, "COMMHOOKS_LAB_PREWARM": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    loaded = ast.literal_eval(out)
    assert all(m == "commhooks_lab" or m.startswith("commhooks_lab.launcher") for m in loaded), loaded


def test_one_version_source():
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    from importlib.metadata import version

    assert version("commhooks_lab") == lab.__version__
