"""The registry's record holds what every consumer needs; each consumer keeps its own extras (issue 53, item 2):
the dashboard's shown options, the CLI's matrix-rank sweep, a compressor's byte rule beside its code, and local
SGD's synchronisation on the optimizer's step hooks."""

import dataclasses
import math
import time

import pytest
import torch

import commhooks_lab as lab
from commhooks_lab import cli
from commhooks_lab.engine.ddp_setup import Setup
from commhooks_lab.hooks import compressors, registry
from commhooks_lab.hooks.local_sgd import attach
from commhooks_lab.hooks.traffic import numel
from commhooks_lab.widgets import shown_options

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

#: What every consumer of a record needs; a field that one consumer alone reads lives with that consumer.
FIELDS = [
    "name",
    "kind",
    "summary",
    "build",
    "wrap",
    "defaults",
    "check",
    "run_name",
    "accelerate",
    "needs",
    "prepare",
    "rank_note",
    "not_compilable",
    "traffic",
    "overlaps_backward",
    "fsdp2_reduce_dtype",
    "short_run",
    "never_compressed",
    "step_post_hook",
]


def test_a_record_has_no_field_for_one_consumer_alone():
    assert [f.name for f in dataclasses.fields(registry.HookEntry)] == FIELDS
    assert "syncer" not in {f.name for f in dataclasses.fields(Setup)}  # the loop asks nothing of local SGD


def _docstring_example() -> str:
    doc = registry.__doc__
    block = doc[doc.index("one record is all it takes::") :].split("::", 1)[1]
    lines = block.split("\n\nA record travels")[0].strip("\n").splitlines()
    return "\n".join(line[4:] for line in lines)


def my_hook(process_group, bucket):
    """A user's hook: the mean over ranks, as allreduce_hook."""
    import torch.distributed as dist

    tensor = bucket.buffer().div_(dist.get_world_size(process_group))
    return dist.all_reduce(tensor, group=process_group, async_op=True).get_future().then(lambda f: f.value()[0])


def test_the_docstrings_example_registers_a_hook_that_runs_and_follows_its_byte_rule():
    code = _docstring_example()
    assert "lab.registry.register(lab.registry.HookEntry(" in code and 'name="my_hook"' in code
    exec(code, {"lab": lab, "my_hook": my_hook})
    try:
        run = lab.run(hook="my_hook", steps=3)
        assert run.ranks_agree and run.name == "my_hook"
        shapes = lab.network.parameter_shapes(lab.models.build_task("mlp", 0).model)
        rule = lab.network.rule_traffic(shapes, "my_hook")
        assert (run.steps["payload_bytes"] == lab.network.payload(rule)).all()
        assert rule["allreduce_bytes"] == 4 * sum(numel(s) for s in shapes)
    finally:
        registry.unregister("my_hook")


def test_the_dashboard_keeps_its_own_shown_options():
    """PowerSGD's short-run start and a float compression rate, without the knobs left to code; a compressor's
    parameter and error feedback, without its seed; every other hook all its options."""
    power = shown_options(registry.get("power_sgd"))
    assert list(power.items()) == [
        ("matrix_approximation_rank", 1),
        ("start_powerSGD_iter", 2),
        ("min_compression_rate", 2.0),
        ("use_error_feedback", True),
        ("warm_start", True),
    ]
    assert isinstance(power["min_compression_rate"], float)
    assert shown_options(registry.get("topk")) == {"ratio": 0.01, "error_feedback": False}
    assert shown_options(registry.get("diloco")) == registry.get("diloco").defaults()


def _configs(*argv: str) -> list:
    return cli.comparison_configs(cli.build_parser().parse_args(["compare", *argv]))


def test_the_cli_sweeps_every_hook_that_takes_a_matrix_rank_from_its_short_run_start():
    assert [c.state_options for c in _configs("--hooks", "power_sgd", "--matrix-rank", "1", "3")] == [
        {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
        {"matrix_approximation_rank": 3, "start_powerSGD_iter": 2},
    ]
    (given,) = _configs("--hooks", "batched_power_sgd[matrix_approximation_rank=2]", "--start-iter", "5")
    assert given.state_options == {"matrix_approximation_rank": 2, "start_powerSGD_iter": 5}
    (spec_start,) = _configs("--hooks", "power_sgd[start_powerSGD_iter=7]", "--matrix-rank", "4", "--start-iter", "5")
    assert spec_start.state_options == {"matrix_approximation_rank": 4, "start_powerSGD_iter": 7}
    assert [c.state_options for c in _configs("--hooks", "fp16", "diloco[sync_every=2]")] == [{}, {"sync_every": 2}]
    low_rank = registry.HookEntry(
        "my_low_rank",
        registry.HOOK,
        "a hook of the user's that takes a matrix rank",
        build=lambda options, process_group: (None, None),
        defaults=lambda: {"matrix_approximation_rank": 1},
    )
    registry.register(low_rank)
    try:  # the sweep follows the option, not a flag on PowerSGD's records
        assert [c.state_options for c in _configs("--hooks", "my_low_rank", "--matrix-rank", "1", "2")] == [
            {"matrix_approximation_rank": 1},
            {"matrix_approximation_rank": 2},
        ]
    finally:
        registry.unregister("my_low_rank")


SHAPES = [(3, 4), (4,), (128, 64), (10,), (7, 3, 3, 3), (1,), (300, 7)]


@pytest.mark.parametrize("name", [e.name for e in registry.entries(registry.COMPRESSOR)])
@pytest.mark.parametrize("error_feedback", [False, True])
def test_each_compressors_byte_rule_is_what_its_encode_makes(name, error_feedback):
    entry = registry.get(name)
    assert entry.build is not None
    _, state = entry.build(entry.options_with_defaults({"error_feedback": error_feedback}), None)
    compressor = state.compressor
    for key, shape in enumerate(SHAPES):
        where = compressors.Where(key=key, step=0, rank=0)
        payload = compressor.compress(torch.randn(shape), where, {})
        assert compressor.payload_bytes(shape) == sum(t.numel() * t.element_size() for t in payload), (name, shape)
        assert compressor.payload_dtypes == len({t.dtype for t in payload}), name
    expected = sum(compressor.payload_bytes(s) for s in SHAPES)
    rule = entry.traffic(SHAPES, 3, {})  # the record reads the compressor's rule
    assert lab.network.payload(rule) == expected
    assert rule["allgather_calls" if not compressor.summable else "allreduce_calls"] == (
        3 if compressor.summable else 3 * compressor.payload_dtypes
    )


def test_the_compression_cost_times_the_registered_compressor(monkeypatch):
    fast = lab.network.compression_cost_per_element(side=64, repeats=3)
    assert list(fast) == ["fp16", "power_sgd r1", "power_sgd r4", "topk 1% + EF", "sign + EF"]
    assert all(0 < v < 1e-5 for v in fast.values())
    encode = compressors.TopK.encode

    def slow_encode(self, x, where):
        time.sleep(0.02)
        return encode(self, x, where)

    monkeypatch.setattr(compressors.TopK, "encode", slow_encode)
    slow = lab.network.compression_cost_per_element(side=64, repeats=3)
    assert slow["topk 1% + EF"] >= 0.02 / 64**2 > 10 * fast["topk 1% + EF"]  # a change to TopK changes its cost
    assert slow["sign + EF"] < 0.02 / 64**2  # and no other's


class _Recorder:
    def __init__(self):
        self.calls = []

    def after_step(self, step, uncounted=None):
        self.calls.append(step)
        return {"synced": step % 2 == 1}


def test_a_syncer_attaches_with_the_optimizers_step_post_hook_and_counts_through_count():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    syncer, counted = _Recorder(), []

    def count(fn):
        counted.append(fn(lambda: None))

    handle = attach(syncer, optimizer, count)
    for _ in range(3):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
    assert syncer.calls == [0, 1, 2]  # numbered from 0, as torchft's _step_post_hook counts its local steps
    assert counted == [{"synced": False}, {"synced": True}, {"synced": False}]
    handle.remove()
    optimizer.step()
    assert syncer.calls == [0, 1, 2] and not math.isnan(model.weight.sum().item())
