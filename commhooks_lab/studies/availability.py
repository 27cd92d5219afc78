"""Which hooks run on this machine, and why not: from trying each once, never a typed guess.

The tries run in a child process (one rank, gloo, a private store): nothing they register,
patch or log touches the notebook's kernel. Registered records travel to it by value, so a
hook registered in a notebook cell is tried too. Results are cached per process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["available_hooks", "main", "root_error"]

_CACHE: dict[tuple, dict] = {}
TRYOUT_TIMEOUT_S = 120.0


def _tried_here() -> dict[str, dict]:
    """``{name: {"runs": bool, "note": str, ...}}`` for every registered record and PyTorch's other hooks."""
    from ..hooks import registry

    entries = registry.entries()
    key = tuple((e.kind, e.name) for e in entries)
    if key not in _CACHE:
        _CACHE[key] = _run_child(entries)
    return _CACHE[key]


def _run_child(entries: list) -> dict[str, dict]:
    import cloudpickle

    from ..hooks import registry
    from ..launcher.environment import child_environment

    env = {**os.environ, **child_environment()}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "commhooks_lab.studies.availability"],
            input=cloudpickle.dumps(entries),
            capture_output=True,
            env=env,
            timeout=TRYOUT_TIMEOUT_S,
            check=False,
        )
        return json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        reason = f"could not try it on this machine ({type(exc).__name__})"
        return {registry.key(e): {"runs": True, "note": reason} for e in entries}


def available_hooks():
    """A table of every registered hook, compressor and wrapper, and of PyTorch's hooks the lab
    does not offer: does each run here, and if not, why (from trying it once, cached)."""
    import pandas as pd

    from ..hooks import registry

    tried = _tried_here()
    rows = []
    for entry in registry.entries():
        outcome = tried.get(registry.key(entry), {})
        rows.append(
            {
                "kind": entry.kind,
                "name": entry.name,
                "runs_here": outcome.get("runs", True),
                "what_it_does": entry.summary,
                "needs": entry.needs,
                "accelerate": entry.accelerate or "",
                "note": outcome.get("note", ""),
            }
        )
    for name, outcome in tried.items():
        if outcome.get("pytorch_only") or outcome.get("fsdp2"):
            rows.append(
                {
                    "kind": "fsdp2 hook point" if outcome.get("fsdp2") else "pytorch (not in the lab)",
                    "name": name,
                    "runs_here": outcome["runs"],
                    "what_it_does": outcome["what"],
                    "needs": outcome.get("needs", ""),
                    "accelerate": "",
                    "note": outcome["note"],
                }
            )
    return pd.DataFrame(rows)


# -- in the child ------------------------------------------------------------------------------------


def root_error(exc: BaseException) -> str:
    """The innermost ``SomeError: message`` line: PyTorch wraps callback errors in RuntimeErrors."""
    text = f"{type(exc).__name__}: {exc}"
    found = re.findall(r"\b([A-Z]\w*(?:Error|Exception): ?(?:(?![A-Z]\w*(?:Error|Exception):)[^\n])*)", text)
    last = found[-1].strip() if found else text.splitlines()[0]
    return f"a bare {last.rstrip(': ')}" if last.endswith(":") else last


def _steps(model, n: int = 3) -> None:
    import torch

    for _ in range(n):
        model(torch.randn(4, 8)).sum().backward()


def _try(fn: Callable[[], Any]) -> str | None:
    try:
        fn()
    except Exception as exc:
        return root_error(exc)
    return None


def _ddp(**ddp_options):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    return DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)), **ddp_options)


def _try_entry(entry) -> dict:
    from .. import _compat
    from ..hooks import registry

    options = entry.options_with_defaults(entry.short_run())
    before_patch = None
    if entry.kind == registry.WRAPPER:
        build, wrap = registry.get("allreduce").build, entry.wrap
        assert build is not None and wrap is not None  # register() guarantees both
        hook, state = build({}, None)
        hook = wrap(hook)
    else:
        assert entry.build is not None  # register() guarantees it
        build = entry.build
        if entry.prepare is not None:  # the hook alone first (once prepare() ran in this process, it runs)

            def unprepared() -> None:
                model = _ddp()
                bare_hook, bare_state = build(options, None)
                model.register_comm_hook(bare_state, bare_hook)
                _steps(model)

            before_patch = _try(unprepared)
            entry.prepare()
        hook, state = build(options, None)
    notes = []
    if before_patch:
        notes.append(
            f"PyTorch's hook alone fails here ({before_patch}); "
            "it runs with the lab's fix, which every run of it applies first"
        )
    if hook is None:  # DDP's built-in allreduce
        error = _try(lambda: _steps(_ddp()))
        return {"runs": error is None, "note": error or ""}
    model = _ddp()
    refusal = _compat.registration_refusal(model, hook)
    if refusal:
        notes.append(
            f"DDP refuses it by name on this build ({refusal}); the lab measures the same arithmetic inside its probe"
        )

    def run() -> None:
        from ..measure.probe import Probe

        probe = Probe(list(model.named_parameters()), 1, 0, measure=False)
        model.register_comm_hook(state, probe.wrap(hook) if refusal else hook)
        _steps(model)

    error = _try(run)
    if error:
        notes.append(error)
    return {"runs": error is None, "note": "; ".join(notes)}


def _gloo_all_gather_layout() -> str:
    import torch
    import torch.distributed as dist

    value = dist.all_gather([torch.zeros(2)], torch.ones(2), async_op=True).get_future().wait()
    inner = type(value[0]).__name__
    return f"{type(value).__name__} of {len(value)} {inner}{'s' if len(value) != 1 else ''}"


def _pytorch_only() -> dict[str, dict]:
    """PyTorch's hooks the lab does not offer, each tried the way its docs say to use it."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook, post_localSGD_hook, quantization_hooks
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    layout = _gloo_all_gather_layout()

    def quantized(hook):
        def run() -> None:
            model = _ddp()
            model.register_comm_hook(None, hook)
            _steps(model)

        return run

    def post_local_sgd() -> None:
        model = _ddp()
        state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=2)
        model.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
        _steps(model)

    def mixed_precision() -> None:
        from torch.nn.parallel.distributed import _MixedPrecision

        _steps(_ddp(mixed_precision=_MixedPrecision(param_dtype=torch.float16)))

    def zero_overlap() -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        model = _ddp()
        zero = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, overlap_with_ddp=True)
        model.register_comm_hook(None, ddp_zero_hook.hook_with_zero_step(allreduce_hook, model, zero))
        _steps(model)

    def fused_optimizer() -> None:
        model = _ddp()
        model._register_fused_optim(torch.optim.SGD, lr=0.1)
        _steps(model)

    quant_why = (
        f"; on gloo an all_gather future holds a {layout} (one per rank), while the hook reads "
        "fut.wait()[0][rank], a list of per-rank tensors inside a list; the lab's int8 compressor "
        "runs on CPU instead"
    )
    tries = {
        "quantization_pertensor_hook": (
            "8-bit per-tensor quantization, all-gathered",
            quantized(quantization_hooks.quantization_pertensor_hook),
            quant_why,
        ),
        "quantization_perchannel_hook": (
            "8-bit per-channel quantization, all-gathered",
            quantized(quantization_hooks.quantization_perchannel_hook),
            quant_why,
        ),
        "post_localSGD_hook": (
            "local SGD after a warm-up, with PyTorch's default subgroups (subgroup=None)",
            post_local_sgd,
            "; the lab's post_local_sgd gives it explicit subgroups of one rank and runs it",
        ),
        "DDP mixed_precision (_reducer_allreduce_and_upcast_hook)": (
            "DDP's private mixed precision: fp16 parameters, upcast before the optimizer",
            mixed_precision,
            "",
        ),
        "hook_with_zero_step (ddp_zero_hook)": (
            "overlaps ZeroRedundancyOptimizer's step with DDP's communication",
            zero_overlap,
            "",
        ),
        "_register_fused_optim (optimizer_overlap_hooks)": (
            "runs the optimizer step inside the hook",
            fused_optimizer,
            "not a gradient compressor, so the lab does not offer it",
        ),
    }
    out = {}
    for name, (what, fn, why) in tries.items():
        error = _said_the_same_way(_try(fn))
        note = (error + why) if error else why.lstrip("; ")
        out[name] = {"runs": error is None, "note": note, "what": what, "pytorch_only": True}
    return out


#: Errors whose wording changes between torch releases, and what the lab says for them instead: the start of
#: the message, then the lab's words. new_subgroups() without group_size makes one subgroup per machine of as many
#: ranks as it has GPUs (distributed_c10d.py); torch 2.13 asks torch.cuda and says "CUDA", torch 2.14 asks
#: torch.accelerator and says "CUDA/XPU".
SAID_THE_SAME_WAY = {
    "ValueError: Default group size only takes effect when": (
        "ValueError (in the lab's words): new_subgroups() without group_size makes one subgroup per machine's GPUs, "
        "and there is no GPU"
    ),
}


def _said_the_same_way(error: str | None) -> str | None:
    """``error`` as every supported torch release words it (:data:`SAID_THE_SAME_WAY`)."""
    for start, said in SAID_THE_SAME_WAY.items():
        if error is not None and error.startswith(start):
            return said
    return error


#: What one step on the availability child's one-rank model shows, and what it cannot.
ONE_RANK_NOTE = (
    "one step on a one-rank sharded model, where FSDP2 skips the reduce-scatter: the API works here, "
    "not that it changes a reduction"
)


#: What the custom reduce-scatter's row says when it ran: FSDP2 calls it at 2+ ranks, the child has one.
CUSTOM_REDUCE_SCATTER_NOTE = (
    "called: the lab builds one, Wire16ReduceScatter (lab.run(api='fsdp2', fsdp2_comm='wire16_reduce_scatter')); "
    "here set on a one-rank sharded model for one step, and called once as FSDP2 calls it at 2+ ranks"
)


def _custom_reduce_scatter(configured: Callable) -> dict:
    """The lab's own ``ReduceScatter``: set on a one-rank model for a step (FSDP2 skips the reduce-scatter at one
    rank), then called with the arguments ``foreach_reduce`` passes, on this one-rank group: AVG of one rank's
    16-bit values gives them back, rounded to 16 bits."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not hasattr(fully_shard(torch.nn.Linear(2, 2)), "set_custom_reduce_scatter"):
        return {"runs": False, "note": "not on this build"}

    def run() -> None:
        from ..engine.fsdp2_comms import Wire16ReduceScatter

        comm = Wire16ReduceScatter(torch.float16)
        configured(lambda model: model.set_custom_reduce_scatter(comm))()
        values = torch.linspace(-1, 1, 8)
        output = comm.allocate((8,), dtype=torch.float32, device=values.device)
        group = dist.group.WORLD
        assert group is not None  # the child's one-rank process group
        comm(output, values, group, dist.ReduceOp.AVG)
        if not torch.equal(output, values.half().float()):
            raise AssertionError(f"Wire16ReduceScatter gave {output.tolist()} for {values.tolist()}")

    error = _try(run)
    return {"runs": error is None, "note": error or CUSTOM_REDUCE_SCATTER_NOTE}


def _fsdp2_hook_points() -> dict[str, dict]:
    """FSDP2's places to change gradient communication, each tried on a sharded model for one step."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def sharded(**policy):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        for layer in model:
            fully_shard(layer, mp_policy=MixedPrecisionPolicy(**policy))
        return fully_shard(model, mp_policy=MixedPrecisionPolicy(**policy))

    def step(model) -> None:
        model(torch.randn(4, 8)).sum().backward()

    def configured(setter: Callable[[Any], Any], **policy: Any) -> Callable[[], None]:
        def run() -> None:
            model = sharded(**policy)
            setter(model)
            step(model)

        return run

    def unchanged(model: Any) -> None:
        pass

    points = {
        "MixedPrecisionPolicy(reduce_dtype=bfloat16)": (
            "reduce gradients in 16 bits: DDP's bf16 hook's counterpart (api='fsdp2', hook='bf16')",
            configured(unchanged, reduce_dtype=torch.bfloat16),
            "",
        ),
        "set_gradient_divide_factor": (
            "divide the reduced gradients by another factor than W",
            configured(lambda m: m.set_gradient_divide_factor(4.0)),
            "",
        ),
        "set_force_sum_reduction_for_comms": (
            "reduce with SUM only, scaling before or after (NCCL's zero-copy collectives need it)",
            configured(lambda m: m.set_force_sum_reduction_for_comms(True)),
            "",
        ),
        "set_all_reduce_hook": (
            "a function called on the reduce-scatter output (HSDP: on the all-reduce output)",
            configured(lambda m: m.set_all_reduce_hook(lambda output: None)),
            "",
        ),
    }
    out = {}
    for name, (what, fn, why) in points.items():
        error = _try(fn)
        out[name] = {
            "runs": error is None,
            "note": error or why or ONE_RANK_NOTE,
            "what": what,
            "fsdp2": True,
            "needs": "torch >= 2.6 (FSDP2, fully_shard); any backend",
        }
    out["set_custom_reduce_scatter"] = {
        **_custom_reduce_scatter(configured),
        "what": "replace the reduce-scatter itself (a ReduceScatter comm object; one param group only)",
        "fsdp2": True,
        "needs": "torch >= 2.6 (FSDP2, fully_shard); any backend",
    }
    return out


def main() -> None:
    import contextlib
    import logging
    import warnings

    with contextlib.suppress(OSError, AttributeError):
        os.nice(10)  # background information (the dashboard's list): the notebook's own run goes first

    import cloudpickle
    import torch.distributed as dist

    from ..hooks import registry

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    entries = cloudpickle.loads(sys.stdin.buffer.read())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    out = {}
    for entry in entries:
        key = registry.key(entry)
        try:
            out[key] = _try_entry(entry)
        except Exception as exc:  # building it failed: that is the answer
            out[key] = {"runs": False, "note": root_error(exc)}
    out.update(_pytorch_only())
    out.update(_fsdp2_hook_points())
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip gloo's teardown: results are out


if __name__ == "__main__":
    main()
