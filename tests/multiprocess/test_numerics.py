"""Portable numerics: what the lab pins, in which processes, and the fingerprint that tells a machine's bits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import commhooks_lab as lab
from commhooks_lab.launcher import fingerprint, numerics
from commhooks_lab.launcher.environment import child_environment

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter with ``env`` added; its stdout."""
    inherited = {k: v for k, v in os.environ.items() if k not in numerics.PORTABLE_VARIABLES}  # ours, set at import
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**inherited, "COMMHOOKS_LAB_PREWARM": "0", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_ranks_get_the_portable_variables_and_native_gets_none(monkeypatch):
    env = child_environment()
    assert {k: env[k] for k in numerics.PORTABLE_VARIABLES} == numerics.PORTABLE_VARIABLES
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    monkeypatch.setenv(numerics.MODE_VARIABLE, "native")
    assert not set(numerics.PORTABLE_VARIABLES) & set(child_environment())
    monkeypatch.setenv(numerics.MODE_VARIABLE, "fast")
    with pytest.raises(ValueError, match="COMMHOOKS_LAB_NUMERICS='fast': use one of portable, native"):
        numerics.mode()


def _cpu_flags() -> set[str]:
    lines = [line for line in open("/proc/cpuinfo") if line.startswith("flags")]
    return set(lines[0].split(":", 1)[1].split()) if lines else set()


#: The tier this CPU runs: ATen's AVX2 kernels where the CPU has AVX2 and FMA, its plain C++ kernels elsewhere.
TIER_KERNELS = "AVX2" if {"avx2", "fma"} <= _cpu_flags() else "DEFAULT"


def test_this_process_runs_its_tiers_kernels_on_one_thread():
    import torch

    torch.ones(1).add_(1)  # ATen picks its kernels at the first operation
    info = numerics.describe()
    assert info["mode"] == "portable" and info["aten_kernels"] == TIER_KERNELS and info["threads"] == 1
    assert info["tier"] == numerics.TIERS[TIER_KERNELS]
    assert info["problems"] == [] and lab.NUMERICS_PROBLEMS == []


def test_the_ranks_run_the_tiers_kernels_too(cluster):
    seen = cluster.run(lambda ctx: numerics.describe())
    assert [(s["aten_kernels"], s["threads"], s["MKL_CBWR"]) for s in seen] == [(TIER_KERNELS, 1, "COMPATIBLE")] * 2


@pytest.fixture(scope="module")
def own_kernels() -> str:
    """The kernels ATen picks on this CPU when nothing caps it: AVX512, AVX2 or DEFAULT."""
    return _python("import torch; print(torch.backends.cpu.get_cpu_capability())", COMMHOOKS_LAB_NUMERICS="native")


def test_native_numerics_leave_the_cpus_own_kernels(own_kernels):
    code = "import commhooks_lab, torch; print(torch.backends.cpu.get_cpu_capability())"
    assert _python(code, COMMHOOKS_LAB_NUMERICS="native") == own_kernels
    assert _python(code) == TIER_KERNELS


def test_torch_used_before_the_import_is_reported_not_hidden():
    """On any x86-64 CPU. ATen takes ``ATEN_CPU_CAPABILITY=avx512`` without asking the CPU and fixes its choice at
    the first question (``compute_cpu_capability`` in ATen's DispatchStub.cpp), so a process that asked before
    the import keeps kernels outside both tiers. No kernel runs, so a CPU without AVX-512 is no exception."""
    code = (
        "import json, torch; torch.backends.cpu.get_cpu_capability(); import commhooks_lab as lab; "
        "print(json.dumps(lab.NUMERICS_PROBLEMS))"
    )
    (problem,) = json.loads(_python(code, ATEN_CPU_CAPABILITY="avx512"))
    assert "already runs its AVX512 kernels" in problem and "import commhooks_lab first" in problem


def test_torch_run_before_the_import_is_reported_only_where_its_kernels_are_not_the_tiers(own_kernels):
    """A learner's torch cell before the lab's import: on an AVX-512 CPU its kernels are outside the tiers and the
    lab says so; on an AVX2-only (or older) CPU they already are its tier's, and there is nothing to report."""
    code = (
        "import json, torch; torch.ones(3) + 1; import commhooks_lab as lab; "
        "from commhooks_lab.launcher import numerics; print(json.dumps([lab.NUMERICS_PROBLEMS, numerics.describe()]))"
    )
    reported, seen = json.loads(_python(code))
    assert seen["aten_kernels"] == own_kernels and seen["threads"] == 1
    if own_kernels in numerics.TIERS:
        assert reported == seen["problems"] == [] and seen["tier"] == numerics.TIERS[own_kernels]
    else:
        (problem,) = reported
        assert f"already runs its {own_kernels} kernels" in problem and seen["problems"] == reported


def _cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("vendor_id")), "")


@pytest.fixture(scope="module")
def portable_fingerprint():
    return fingerprint.in_child()


def test_this_machine_gives_the_reference_bits(portable_fingerprint):
    ref = fingerprint.reference()
    if (portable_fingerprint["torch"], portable_fingerprint["machine"]) != (ref["torch"], ref["machine"]):
        pytest.skip(f"the reference is for torch {ref['torch']} on {ref['machine']}")
    assert fingerprint.differences(portable_fingerprint) == []


def test_another_kernel_path_shows_in_the_fingerprint(portable_fingerprint):
    """The fingerprint has teeth: the pre-AVX2 tier (ATen's plain kernels, oneDNN at SSE4.1) gives other bits than
    the AVX2 tier on every CPU, and on Intel's so does MKL's AVX2 path (native numerics) than its CPU-independent
    one. On an AMD EPYC (Zen 4) MKL gave this GEMM the same bits under ``MKL_CBWR=AVX2`` as under ``COMPATIBLE``."""
    if portable_fingerprint["aten_kernels"] != "AVX2":
        pytest.skip(f"this CPU runs the pre-AVX2 tier ({portable_fingerprint['aten_kernels']})")
    env = {**fingerprint.environment(), "COMMHOOKS_LAB_NUMERICS": "native", "ATEN_CPU_CAPABILITY": "avx2"}
    env.update(MKL_CBWR="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
    if _cpu_vendor() == "GenuineIntel":
        problems = fingerprint.differences(fingerprint.in_child(env), portable_fingerprint)
        assert any(p.startswith("mlp differs") for p in problems), problems
    env.update(ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE", ONEDNN_MAX_CPU_ISA="SSE41")
    problems = fingerprint.differences(fingerprint.in_child(env), portable_fingerprint)
    assert any(p.startswith("random differs") for p in problems), problems
    assert any(p.startswith("conv differs") for p in problems), problems


def test_a_build_without_a_reference_is_named():
    seen = {"torch": "2.99.0", "machine": "arm64", "parts": {}}
    *parts, build = fingerprint.differences(seen)
    assert len(parts) == len(fingerprint.PARTS)  # the verdict is the digests': none was computed here
    assert "torch 2.99.0 on arm64" in build and "another build or architecture" in build
