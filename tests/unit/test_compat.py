"""Each private PyTorch/Accelerate touch in commhooks_lab._compat, checked against the installed versions.

When one of these fails after an upgrade, its message names the versions: read _compat.py first.
"""

import inspect

import pytest
import torch

from commhooks_lab import _compat

VERSIONS = _compat.versions()


def test_every_touch_is_listed_and_exists():
    names = [name for name, _ in _compat.TOUCHES]
    assert all(callable(getattr(_compat, n)) for n in names)
    assert len(names) == 13


def test_power_sgd_defaults_come_from_the_signature():
    defaults = _compat.power_sgd_defaults()
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    assert defaults["start_powerSGD_iter"] == inspect.signature(PowerSGDState).parameters["start_powerSGD_iter"].default
    assert defaults["start_powerSGD_iter"] == 1000, f"{VERSIONS}: PowerSGD's default start changed; update the notes"
    assert {"matrix_approximation_rank", "use_error_feedback", "warm_start", "min_compression_rate"} <= set(defaults)


def test_batched_powersgd_fix_is_needed_and_only_reshapes():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    original = getattr(powerSGD_hook._orthogonalize, "__wrapped__", powerSGD_hook._orthogonalize)
    with pytest.raises(Exception):  # noqa: B017 - whatever it raises, the 2-D input is refused
        original(torch.tensor([[3.0], [4.0]]))
    assert _compat.orthogonalize_rejects_matrices() or _compat.batched_fix_active(), (
        f"{VERSIONS}: _orthogonalize now takes a 2-D matrix; the lab's batched PowerSGD fix can go"
    )
    _compat.patch_batched_orthogonalize()
    assert _compat.batched_fix_active() and not _compat.orthogonalize_rejects_matrices()
    matrices = torch.tensor([[[3.0], [4.0]]])  # a 3-D batch, PowerSGD's own input, goes through untouched
    powerSGD_hook._orthogonalize(matrices)
    assert torch.allclose(matrices, torch.tensor([[[0.6], [0.8]]]))


def test_ddp_still_has_its_private_hook_check():
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert hasattr(DDP, "_check_comm_hook"), f"{VERSIONS}: DDP._check_comm_hook is gone; update registration_refusal"
    source = inspect.getsource(DDP._check_comm_hook)
    assert "bf16_compress_hook" in source, f"{VERSIONS}: DDP no longer refuses bf16 hooks by name"


def test_registration_refusal_names_the_bf16_refusal_on_this_build():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    class FakeDDP:
        _check_comm_hook = torch.nn.parallel.DistributedDataParallel._check_comm_hook

        def _log_and_throw(self, err_type, err_msg):
            raise err_type(err_msg)

    refusal = _compat.registration_refusal(FakeDDP(), default_hooks.bf16_compress_hook)
    assert _compat.bf16_refusal() == refusal  # the same check, without a DDP model
    assert _compat.registration_refusal(FakeDDP(), default_hooks.fp16_compress_hook) is None
    # the rule the lessons teach: the build decides (a CUDA or ROCm build carries NCCL), not the devices
    if torch.version.cuda is None and torch.version.hip is None:
        assert refusal and refusal.startswith("TypeError: BF16 all reduce communication hook required CUDA 11+")
    else:
        assert refusal is None, f"{VERSIONS}: a CUDA/ROCm build refuses bf16 ({refusal}); notebook 3 says otherwise"


def test_ddp_hook_check_runs_unbound_on_a_stand_in():
    """DDP's _check_comm_hook needs only _log_and_throw from self: the lab calls it before any process starts."""
    import torch.distributed as dist

    def annotated(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        raise AssertionError("never called")

    def wrong_return(state, bucket) -> torch.futures.Future:
        raise AssertionError("never called")

    def misnamed(state, b):
        raise AssertionError("never called")

    assert _compat.comm_hook_check_error(annotated) is None, VERSIONS
    error = _compat.comm_hook_check_error(wrong_return)
    assert isinstance(error, ValueError) and "return annotation should be" in str(error), VERSIONS
    assert isinstance(_compat.comm_hook_check_error(misnamed), KeyError), f"{VERSIONS}: DDP no longer looks up 'bucket'"


def test_every_hook_future_derives_from_the_private_future_type():
    """``.then()`` (and Work.get_future()) give torch._C.Future, which torch.futures.Future only subclasses."""
    base = _compat.future_type()
    assert issubclass(torch.futures.Future, base), VERSIONS
    chained = torch.futures.Future().then(lambda f: f.value())
    assert isinstance(chained, base) and not isinstance(chained, torch.futures.Future), VERSIONS


def test_fsdp2s_reduce_scatter_interface_is_where_the_custom_comm_expects_it():
    """set_custom_reduce_scatter takes a ReduceScatter: abstract __call__ and allocate; FSDP2's default is one."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    base = _compat.fsdp2_reduce_scatter_base()
    assert issubclass(DefaultReduceScatter, base), VERSIONS
    assert base.__abstractmethods__ == {"__call__", "allocate"}, VERSIONS


def test_a_missing_private_name_says_which_versions():
    with pytest.raises(_compat.UpstreamChanged, match=r"torch \d+\.\d+"):
        _compat.registration_refusal(object(), print)


def test_intercepting_registration_restores_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    original = DDP.register_comm_hook
    with _compat.intercept_comm_hook_registration(lambda *a: None):
        assert DDP.register_comm_hook is not original
    assert DDP.register_comm_hook is original


def test_accelerate_state_reset_exists():
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    assert hasattr(AcceleratorState, "_reset_state") and hasattr(GradientState, "_reset_state"), VERSIONS
    assert "reset_partial_state" in inspect.signature(AcceleratorState._reset_state).parameters, VERSIONS
    _compat.reset_accelerate_state()
