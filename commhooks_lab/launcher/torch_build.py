"""How this torch was built, and what DDP does with ``bf16_compress_hook`` on it: found by trying, not guessed.

DDP's ``_check_comm_hook`` (``torch/nn/parallel/distributed.py``) refuses ``bf16_compress_hook`` and
``bf16_compress_wrapper_hook`` by name unless ``torch.version.cuda`` or ``torch.version.hip`` is set and
``torch.cuda.nccl.version() >= (2, 10)``, or XCCL is available with an XPU present. It reads the build, not the
devices: PyPI's Linux wheels are CUDA builds, so on a machine without a GPU DDP still accepts the hook and gloo
reduces bfloat16; a CPU build (PyTorch's CPU index) refuses it. :func:`in_child` tries it in a one-rank gloo group
in a fresh interpreter, so that ``doctor`` and ``scripts/against_torch.py`` report what DDP did.
"""

from __future__ import annotations

import json
import subprocess
import sys

__all__ = ["describe", "in_child", "this_build", "try_bf16_hook"]


def this_build() -> dict:
    """What torch was built with (``cuda``/``hip``: the toolkit versions, None if not), NCCL's version, GPUs."""
    import torch
    import torch.distributed as dist

    nccl = None
    if dist.is_available() and dist.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "nccl": nccl,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def describe(build: dict) -> str:
    """``build`` in words: 'torch 2.13.0+cpu, a CPU build' or 'torch 2.14.1+cu130, a CUDA 13.0 build with ...'."""
    if build["cuda"] or build["hip"]:
        kind = f"a CUDA {build['cuda']}" if build["cuda"] else f"a ROCm {build['hip']}"
        nccl = f" with NCCL {build['nccl']}" if build["nccl"] else " without NCCL"
        gpus = f"{build['gpus']} GPU{'s' if build['gpus'] != 1 else ''}" if build["gpus"] else "no GPU"
        return f"torch {build['torch']}, {kind} build{nccl}, {gpus}"
    return f"torch {build['torch']}, a CPU build"


def try_bf16_hook() -> dict:
    """Register ``bf16_compress_hook`` on a DDP model in a one-rank gloo group of this process and take one step.

    Returns ``accepted`` (DDP took it), ``refusal`` (DDP's error when it did not) and ``rounded`` (the step's
    gradient came back as the local one rounded to bfloat16: the hook ran and gloo reduced bfloat16). Starts a
    process group: call it in a process of its own (:func:`in_child`)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(8, 4), torch.randn(16, 8)
    layer(x).square().sum().backward()
    assert layer.weight.grad is not None
    local = layer.weight.grad.clone()
    layer.zero_grad()
    model = DDP(layer)
    try:
        model.register_comm_hook(None, bf16_compress_hook)
    except TypeError as exc:  # DDP's name check: see the module's docstring
        return {"accepted": False, "refusal": f"{type(exc).__name__}: {exc}", "rounded": None}
    model(x).square().sum().backward()
    rounded = torch.equal(layer.weight.grad, local.to(torch.bfloat16).float())
    return {"accepted": True, "refusal": None, "rounded": rounded}


def in_child(executable: str | None = None, timeout_s: float = 120) -> dict:
    """``{"build": this_build(), "bf16": try_bf16_hook()}`` from a fresh interpreter (``executable``: another venv)."""
    done = subprocess.run(
        [executable or sys.executable, "-m", "commhooks_lab.launcher.torch_build"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import os

    report = {"build": this_build(), "bf16": try_bf16_hook()}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip gloo's teardown: the answer is out


if __name__ == "__main__":
    main()
