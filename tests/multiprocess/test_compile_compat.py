"""The torch.compile compatibility matrix is computed on real ranks and asserts the facts issue 16 found
(or fails naming what PyTorch changed); runs under each compile mode train the same weights."""

import math

import pytest
import torch
import torch.distributed as dist

import commhooks_lab as lab
from commhooks_lab import _compat
from commhooks_lab.hooks import registry
from commhooks_lab.hooks.choice import as_choice
from commhooks_lab.hooks.contract import bucket_tensor, completed_future
from commhooks_lab.studies.compile_matrix import MODES, compile_compatibility, default_lineup

pytestmark = [pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.heavy]
VERSION = torch.__version__


def bucket_only_hook(state, bucket):
    """A learner's first hook: reads bucket.buffer(), as every GradBucket hook does."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer.div_(dist.get_world_size()))
    return completed_future(buffer)


def both_forms_hook(state, bucket):
    """The same hook, compile-safe: the tensor in either form, the result written in place before returning."""
    buffer = bucket_tensor(bucket)
    dist.all_reduce(buffer.div_(dist.get_world_size()))
    return completed_future(buffer)


@pytest.fixture(scope="module")
def matrix(cluster):
    """On the module's two warm ranks, which the other tests here share: a start of ranks costs seconds. No test here
    reads graph breaks (notebook 11's check does, tested beside it), so the hooks share Dynamo's caches: 10 instead of
    25 CPU-seconds a rank, with the same runs, errors and gradients as from a reset per case."""
    lineup = default_lineup() + [bucket_only_hook, both_forms_hook]
    table = compile_compatibility(lineup, cluster=cluster, count_breaks=False)
    return table.set_index(["hook", "mode"])


def test_every_hook_runs_eager_and_under_ddp_optimizer_bit_identically(matrix):
    for hook in matrix.index.get_level_values("hook").unique():
        for mode in ("eager", "ddp_optimizer"):
            row = matrix.loc[(hook, mode)]
            assert row["runs"], f"torch {VERSION}: {hook} {mode}: {row['error']}"
            assert row["bit_identical_to_eager"], f"{hook} {mode}"


def test_compiled_autograd_hands_hooks_a_tuple(matrix):
    """PyTorch's fp16 hook accepts the tuple compiled autograd passes; allreduce_hook and powerSGD_hook do not."""
    fp16 = matrix.loc[("fp16", "compiled_autograd")]
    assert fp16["runs"] and fp16["bit_identical_to_eager"], f"torch {VERSION}: {fp16['error']}"
    for hook in ("allreduce", "power_sgd r1", "noop", "bucket_only_hook"):
        row = matrix.loc[(hook, "compiled_autograd")]
        assert not row["runs"], f"torch {VERSION}: {hook} now runs under compiled autograd; update notebook 11's claim"
        assert "'tuple' object has no attribute 'buffer'" in row["error"], f"torch {VERSION}: {row['error']}"
    wrapped = matrix.loc[("fp16_wrapper(allreduce)", "compiled_autograd")]
    assert "'tuple' object has no attribute 'set_buffer'" in wrapped["error"], f"torch {VERSION}: {wrapped['error']}"
    safe = matrix.loc[("both_forms_hook", "compiled_autograd")]
    assert safe["runs"] and safe["bit_identical_to_eager"], safe["error"]


def test_the_registry_says_which_hooks_compile_as_the_matrix_found(matrix):
    """Every registered hook, compressor and wrapper: not_compilable is set exactly where the run failed."""
    rows = matrix.xs("compiled_autograd", level="mode")
    choices = {as_choice(item).name: item for item in default_lineup()}
    for name, item in choices.items():
        choice = as_choice(item)
        declared = [
            e.not_compilable for e in (choice.entry, choice.wrapper_entry) if e is not None and e.not_compilable
        ]
        assert bool(declared) != bool(rows.loc[name, "runs"]), (
            f"{name}: declared {declared}, ran {rows.loc[name, 'runs']}"
        )


def test_the_zoo_runs_under_compiled_autograd_and_deterministic_compressors_match_eager(matrix):
    for entry in registry.entries(registry.COMPRESSOR):
        name = as_choice(entry.name).name
        row = matrix.loc[(name, "compiled_autograd")]
        assert row["runs"], f"{name}: {row['error']}"
    for name in ("topk 1%", "sign", "int8 per-channel", "wire16_sum32 bfloat16", "ring16 bfloat16"):
        assert matrix.loc[(name, "compiled_autograd"), "bit_identical_to_eager"], name
    # Seeded compressors draw per parameter key, and keys go out in the order the hook first meets each
    # parameter: model order in eager DDP's first bucket, backward order under compiled autograd.
    assert not matrix.loc[("randomk 1%", "compiled_autograd"), "bit_identical_to_eager"]


def test_the_matrix_is_cached_per_process(cluster):
    first = compile_compatibility(["fp16"], modes=("eager",), cluster=cluster)
    again = compile_compatibility(["fp16"], modes=("eager",), cluster=cluster)  # not run again: the same seconds
    assert again.equals(first)
    with pytest.raises(ValueError, match="unknown modes"):
        compile_compatibility(["fp16"], modes=("jit",))


# -- Dynamo, imported and counted ----------------------------------------------------------------------


def test_graph_breaks_counts_a_future_made_in_compiled_code():
    """Notebook 11's exercise rejects a hook that builds a Future under compiled autograd by this count."""
    import warnings

    import torch._dynamo

    def makes_a_future(x):
        done = torch.futures.Future()
        done.set_result(x)
        return x * 2

    torch._dynamo.reset()
    before = _compat.graph_breaks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo warns about pybind11's __new__: the break we count
        torch.compile(makes_a_future, backend="eager")(torch.ones(2))
    after = _compat.graph_breaks()
    assert sum(after.values()) > sum(before.values()), f"{VERSION}: no graph break counted for a Future"
    assert any(_compat.is_future_graph_break(why) for why in after), (VERSION, list(after))
    torch._dynamo.reset()


def test_choosing_a_compressor_does_not_import_dynamo():
    """The compressors' compiled-autograd path is disabled for Dynamo lazily: a kernel that only chooses and
    checks a top-k run must not pay Dynamo's import, about a second (the matrix
    above runs that path under compiled autograd)."""
    import subprocess
    import sys

    code = (
        "import sys; from commhooks_lab.experiment import ExperimentConfig, as_config; "
        "as_config('topk', ExperimentConfig()).check(); print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


# -- runs under torch.compile -----------------------------------------------------------------------


def test_every_compile_mode_trains_the_same_weights(cluster):
    runs = {
        mode: lab.run(hook="topk", steps=3, compile=mode, measure=mode != "compiled_autograd", cluster=cluster)
        for mode in MODES
    }
    digests = {mode: r.final["param_digests"][0] for mode, r in runs.items()}
    assert len(set(digests.values())) == 1, digests
    assert runs["eager"].steps["loss"].tolist() == runs["compiled_autograd"].steps["loss"].tolist()
    assert runs["ddp_optimizer"].steps["payload_bytes"].tolist() == runs["eager"].steps["payload_bytes"].tolist()
    blind = runs["compiled_autograd"]
    assert all(math.isnan(b) for b in blind.steps["payload_bytes"]) and "bytes not counted" in blind.notes[-1]
    assert blind.summary()["compressed_steps"] == "not counted"
