"""Other CPUs, for real: ranks under an emulated Intel Haswell and an emulated AMD EPYC (AVX2, no AVX-512) give
this machine's numbers bit for bit, and the hook challenge's scores and leaderboard page made from them.

qemu-user runs each rank's interpreter as if on the other CPU (``torch.backends.cpu.get_cpu_capability()`` there
says AVX2, and the CPU's vendor is the model's: GenuineIntel or AuthenticAMD, which MKL reads). What worked: this
native parent, and ranks spawned through a wrapper executable (``multiprocessing.set_executable``) that execs the
interpreter under ``qemu-x86_64 -cpu MODEL``, one rank on each model; an exec from inside qemu-user runs natively,
and qemu-user 7.2 aborts when a threaded process forks, so neither a forkserver nor an emulated parent would do.
About 12x slower than native (``import torch`` ~20 s).
"""

import multiprocessing
import os
import platform
import shutil
import sys
from multiprocessing import spawn

import pytest
from _same_run import assert_same_run
from torch.utils.data import TensorDataset

import commhooks_lab as lab
from commhooks_lab.engine import models
from commhooks_lab.launcher import fingerprint, numerics

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

QEMU = shutil.which("qemu-x86_64")
CPU = "Haswell-v4"
#: One rank on each vendor's model: Intel's Haswell, AMD's first EPYC (Zen).
CPUS = ("Haswell-v4", "EPYC")


def _small_cnn():
    """``small_cnn(seed)``: the course's CNN task, its test set cut to 32 images (the same layers and kernels, a
    ninth of the scoring). Made in a function so that cloudpickle sends it by value: by reference, each emulated
    rank would import this test module, pytest and pandas with it."""

    def small_cnn(seed: int) -> models.Task:
        task = models.cnn_task(seed)
        task.test = TensorDataset(*(t[:32] for t in task.test.tensors))
        return task

    return small_cnn


#: An MLP (MKL's GEMM, ATen's activations, fp16 casts), PowerSGD (QR, Gram-Schmidt) and a CNN (oneDNN's
#: convolutions). The CNN runs on 8 images a rank, not 32, and is scored on 32 test images, not 359 (the lab's own
#: task, ``small_cnn``): under qemu its final accuracy alone cost 7 CPU-seconds and its 32-image steps 13,
#: for no kernel the small case does not run. Every case still differs bit for bit on the emulated CPUs under
#: native numerics (MKL's own code path there): checked when this workload was chosen, 2026-12-07.
CASES = {
    "mlp fp16": {"model": "mlp", "hook": "fp16"},
    "mlp power_sgd r1": {
        "model": "mlp",
        "hook": "power_sgd",
        "state_options": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
    },
    "cnn allreduce": {"model": _small_cnn(), "hook": "allreduce", "batch_size": 8},
}
#: PowerSGD compresses from step 2 (start_powerSGD_iter=2): in four steps the last uses the error feedback and the
#: warm-started Q of the one before.
STEPS = 4
#: An emulated rank is about 12x slower, and slower again while other tests share the two cores (``pytest -n 2``):
#: the default 30 s per run is not enough there. The same value on both sides, so the configs compare equal.
TIMEOUT_S = 600


def _no_emulator() -> None:
    if platform.machine() != "x86_64":
        pytest.skip(f"qemu-x86_64 emulates an x86-64 CPU; this machine is {platform.machine()}")
    if os.environ.get("CI"):
        pytest.fail("CI must install Debian's qemu-user: apt-get install -y qemu-user", pytrace=False)
    pytest.skip("needs qemu-x86_64 (Debian: apt-get install -y qemu-user)")


@pytest.fixture(scope="module")
def emulated_python(tmp_path_factory):
    if QEMU is None or platform.machine() != "x86_64":
        _no_emulator()
    folder = tmp_path_factory.mktemp("qemu")
    wrapper = folder / "python-on-haswell"
    wrapper.write_text(f'#!/bin/sh\nexec {QEMU} -cpu {CPU} {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.fixture(scope="module")
def python_on_either_vendor(tmp_path_factory):
    """An executable whose spawned ranks run on the models of CPUS in turn (flock keeps the count); it logs which.
    Other children of multiprocessing (its resource tracker) run natively."""
    if QEMU is None or platform.machine() != "x86_64":
        _no_emulator()
    folder = tmp_path_factory.mktemp("qemu")
    wrapper = folder / "python-on-intel-or-amd"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'case "$*" in *spawn_main*) ;; *) exec {sys.executable} "$@" ;; esac\n'
        f"exec 9>{folder}/lock; flock 9\n"
        f"n=$(wc -l < {folder}/log 2>/dev/null || echo 0)\n"
        f"cpus=({' '.join(CPUS)}); cpu=${{cpus[$((n % {len(CPUS)}))]}}\n"
        f"echo $cpu >> {folder}/log; exec 9>&-\n"
        f'exec {QEMU} -cpu $cpu {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper), folder / "log"


def test_the_emulated_cpu_is_another_cpu_and_native_numerics_show_it(emulated_python):
    """Teeth: under the emulator ATen picks other kernels, and without portable numerics the bits differ."""
    env = fingerprint.environment()
    for name in numerics.PORTABLE_VARIABLES:
        env.pop(name)
    env[numerics.MODE_VARIABLE] = "native"
    seen = fingerprint.in_child(env, executable=emulated_python, timeout_s=TIMEOUT_S)
    assert seen["aten_kernels"] == "AVX2"
    assert fingerprint.differences(seen) != []  # portable numerics there: the next test's ranks


def test_ranks_on_emulated_intel_and_amd_cpus_give_this_machines_numbers_bit_for_bit(python_on_either_vendor):
    executable, log = python_on_either_vendor
    with lab.Cluster(world_size=2, timeout_s=TIMEOUT_S) as here:  # warm, as the emulated side is
        native = {name: lab.run(steps=STEPS, cluster=here, timeout_s=TIMEOUT_S, **case) for name, case in CASES.items()}
    previous = spawn.get_executable()
    multiprocessing.set_executable(executable)
    try:
        with lab.Cluster(world_size=2, start_method="spawn", timeout_s=TIMEOUT_S) as emulated:
            kernels = emulated.run(lambda ctx: __import__("torch").backends.cpu.get_cpu_capability())
            runs = {
                name: lab.run(steps=STEPS, cluster=emulated, timeout_s=TIMEOUT_S, **case)
                for name, case in CASES.items()
            }
    finally:
        multiprocessing.set_executable(previous)
    assert kernels == ["AVX2", "AVX2"]  # the AVX2 tier of portable numerics, on both vendors' models
    assert sorted(log.read_text().split()) == sorted(CPUS)
    for name in CASES:
        assert_same_run(runs[name], native[name])
    # the hook challenge's scores and leaderboard page, made from each side's runs: the same page, byte for byte
    assert _leaderboard_page(runs) == _leaderboard_page(native)


def _leaderboard_page(runs) -> str:
    """The challenge's page for the MLP cases, scored from ``runs`` as the challenge scores its own runs."""
    from commhooks_lab.challenge.leaderboard import render
    from commhooks_lab.challenge.score import Score, lab_versions, ranked, score_task
    from commhooks_lab.challenge.tasks import ChallengeTask

    scores = []
    for name in ("mlp fp16", "mlp power_sgd r1"):
        scored = Score(name, versions=lab_versions())
        scored.tasks.append(score_task(runs[name], ChallengeTask("mlp", steps=STEPS)))
        assert scored.value is not None, scored.disqualified
        scores.append(scored)
    return render(ranked(scores), "ranks under qemu-x86_64 or native")
