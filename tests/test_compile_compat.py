"""The torch.compile compatibility matrix is computed on real ranks and asserts the facts issue 16 found
(or fails naming what PyTorch changed)."""

import pytest
import torch

from commhooks_lab.compile_compat import compile_compatibility

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def matrix():
    table = compile_compatibility(["allreduce", "fp16", "power_sgd"])
    return table.set_index(["hook", "mode"])


def test_every_hook_runs_eager_and_under_ddp_optimizer_bit_identically(matrix):
    for hook in ("allreduce", "fp16", "power_sgd"):
        for mode in ("eager", "ddp_optimizer"):
            row = matrix.loc[(hook, mode)]
            assert row["runs"], f"{hook} {mode}: {row['error']}"
            assert row["bit_identical_to_eager"]


def test_compiled_autograd_hands_hooks_a_tuple(matrix):
    """PyTorch's fp16 hook accepts the tuple compiled autograd passes; allreduce_hook and powerSGD_hook do not."""
    version = torch.__version__
    fp16 = matrix.loc[("fp16", "compiled_autograd")]
    assert fp16["runs"] and fp16["bit_identical_to_eager"], f"torch {version}: {fp16['error']}"
    for hook in ("allreduce", "power_sgd"):
        row = matrix.loc[(hook, "compiled_autograd")]
        assert not row["runs"], f"torch {version}: {hook} now runs under compiled autograd; update notebook 10's claim"
        assert "'tuple' object has no attribute 'buffer'" in row["error"], f"torch {version}: {row['error']}"


def test_the_matrix_is_cached_per_process(matrix):
    from commhooks_lab import compile_compat

    assert (("allreduce", "fp16", "power_sgd"), compile_compat.MODES, "aot_eager") in compile_compat._CACHE
    again = compile_compatibility(["allreduce", "fp16", "power_sgd"])  # no new ranks: the same measured seconds
    assert again.set_index(["hook", "mode"]).equals(matrix)
