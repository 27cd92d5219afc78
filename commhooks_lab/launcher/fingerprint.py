"""A tiny computation whose bits tell whether this machine gives the numbers the notebooks were made with.

Each part exercises one library the lab's numbers pass through (ATen's element-wise and reduction kernels,
MKL's GEMM and LAPACK, oneDNN's convolutions, 16-bit rounding), so a mismatch names its cause. ``doctor``
runs it in a fresh child process with the environment the ranks get and compares it with
``reference_fingerprint.json``, which ``python -m commhooks_lab.launcher.fingerprint --write`` made on the machine
the committed outputs come from.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import resources
from pathlib import Path

__all__ = ["compute", "differences", "environment", "in_child", "main", "other_build", "reference", "report"]

REFERENCE_FILE = "reference_fingerprint.json"

#: What each part's bits depend on, for the message when it differs. Every part but ``random`` starts from
#: inputs made with integer arithmetic (exact everywhere), so a difference is that part's own.
PARTS = {
    "random": "torch's random number generators (randn's and rand's vectorised kernels; weights, data order)",
    "mlp": "a linear layer's forward and backward (MKL's GEMM, ATen's activations)",
    "conv": "a convolution's forward and backward (oneDNN)",
    "linalg": "QR and singular values (MKL's LAPACK; PowerSGD's orthogonalisation, notebook 4's spectra)",
    "reduce": "a 2^20-element sum and norm (ATen's vectorised reductions, the thread count)",
    "round16": "float16 and bfloat16 rounding and their sum (ATen's casts)",
}


def _digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _inputs(*shape: int, salt: int = 0):
    """Floats in [-1, 1) from a multiplicative hash of the index: integer arithmetic, the same bits on any CPU."""
    import torch

    n = 1
    for size in shape:
        n *= size
    index = torch.arange(n, dtype=torch.int64) + salt * n
    return ((index * 2654435761 + 12345) % (1 << 24)).to(torch.float32).div_(1 << 23).sub_(1).reshape(shape)


def compute() -> dict[str, str]:
    """The fingerprint of this process: part name -> digest of its results' bytes."""
    import torch

    gen = torch.Generator().manual_seed(0)
    parts = {"random": _digest(torch.randn(4096, generator=gen), torch.rand(4096, generator=gen))}

    x, w = _inputs(32, 64, salt=1), _inputs(64, 10, salt=2).requires_grad_()
    loss = torch.nn.functional.cross_entropy(torch.tanh(x @ w), torch.arange(32) % 10)
    loss.backward()
    parts["mlp"] = _digest(loss, w.grad)

    images, weight = _inputs(4, 1, 8, 8, salt=3), _inputs(8, 1, 3, 3, salt=4).requires_grad_()
    out = torch.nn.functional.conv2d(images, weight)
    out.square().mean().backward()
    parts["conv"] = _digest(out, weight.grad)

    m = _inputs(64, 32, salt=5)
    q, r = torch.linalg.qr(m)
    parts["linalg"] = _digest(q, r, torch.linalg.svdvals(m))

    big = _inputs(1 << 20, salt=6)
    parts["reduce"] = _digest(big.sum(), torch.linalg.vector_norm(big), big.abs().mean())

    halves = (big[:4096] * 3.3).to(torch.float16), (big[4096:8192] * 3.3).to(torch.bfloat16)
    parts["round16"] = _digest(halves[0], halves[1].float(), (halves[0] + halves[0] * 0.7).float())
    return parts


def environment() -> dict[str, str]:
    """The environment a rank gets (portable numerics unless ``COMMHOOKS_LAB_NUMERICS=native``)."""
    from .environment import PREWARM_VARIABLE, child_environment

    return {**os.environ, **child_environment(), PREWARM_VARIABLE: "0"}


def in_child(env: dict[str, str] | None = None, executable: str | None = None, timeout_s: float = 300) -> dict:
    """:func:`compute` in a fresh interpreter (a rank's environment by default), with the kernels it ran."""
    code = "import json, commhooks_lab.launcher.fingerprint as f; print(json.dumps(f.report()))"
    out = subprocess.run(
        [executable or sys.executable, "-c", code],
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def report() -> dict:
    """This process's fingerprint with what it ran on (what ``--write`` saves, what ``doctor`` compares)."""
    import torch

    from . import numerics

    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "numerics": numerics.mode(),
        "aten_kernels": torch.backends.cpu.get_cpu_capability(),
        "parts": compute(),
    }


def reference() -> dict:
    """The fingerprint of the machine the committed notebook outputs were made on."""
    return json.loads((resources.files("commhooks_lab") / REFERENCE_FILE).read_text())


def differences(seen: dict, ref: dict | None = None) -> list[str]:
    """Why ``seen`` would not give the reference numbers: one line per part whose bits differ (empty: it would).

    The verdict is the digests': another torch (a CUDA build, a newer release) or architecture gave the reference
    bits where they match, and is named as the likely cause only where they do not."""
    ref = reference() if ref is None else ref
    problems = [
        f"{name} differs: {PARTS[name]}" for name, digest in ref["parts"].items() if seen["parts"].get(name) != digest
    ]
    other = other_build(seen, ref)
    if problems and other:
        problems.append(f"{other}: another build or architecture can compute other bits")
    return problems


def other_build(seen: dict, ref: dict | None = None) -> str:
    """'torch X on M, the reference is torch Y on N' where they are not the same, else ''."""
    ref = reference() if ref is None else ref
    if (seen["torch"], seen["machine"]) == (ref["torch"], ref["machine"]):
        return ""
    return f"torch {seen['torch']} on {seen['machine']}, the reference is torch {ref['torch']} on {ref['machine']}"


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        seen = in_child()
        path = Path(__file__).parents[1] / REFERENCE_FILE  # package data at the top, where reference() reads it
        path.write_text(json.dumps(seen, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}: {seen}")
        return 0
    seen = in_child()
    print(json.dumps(seen, indent=2))
    problems = differences(seen)
    same = f"same bits as the reference in all {len(seen['parts'])} parts"
    other = other_build(seen)
    print("\n".join(problems) or (f"{same} ({other})" if other else same))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
