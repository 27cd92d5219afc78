"""The preflight doctor: passes on this machine, and says what to do when a check is forced to fail."""

import multiprocessing

import pytest

from commhooks_lab import doctor

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def test_doctor_is_a_command_that_passes_here_and_prints_a_table():
    """One full run, as a learner types it (it starts ranks: seconds; it ran twice, in-process and as a command)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "commhooks_lab", "doctor"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in (
        "python",
        "torch",
        "private rendezvous",
        "start method spawn",
        "2-rank gloo all-reduce",
        "reference numbers",
        "ipywidgets",
        "matplotlib",
        "nbval",
    ):
        assert name in done.stdout
    assert f"all {len(doctor.all_checks())} checks passed" in done.stdout and "FAIL" not in done.stdout


def test_a_blocked_start_method_fails_with_advice(monkeypatch):
    real = multiprocessing.get_context

    def blocked(method=None):
        if method == "forkserver":
            raise PermissionError("operation not permitted")
        return real(method)

    monkeypatch.setattr(multiprocessing, "get_context", blocked)
    result = doctor.check_start_method("forkserver")
    assert result.status == doctor.FAIL and "PermissionError" in result.seen
    assert "cannot be started with 'forkserver'" in result.advice
    assert doctor.check_start_method("spawn").status == doctor.PASS


def test_a_mismatched_widget_frontend_fails_with_the_fix(monkeypatch):
    versions = {"ipywidgets": "8.1.9", "jupyterlab_widgets": "1.1.7"}
    monkeypatch.setattr(doctor, "_version", versions.get)
    result = doctor.check_widgets()
    assert result.status == doctor.FAIL and "Error displaying widget" in result.advice
    assert "jupyterlab_widgets>=3,<4" in result.advice
    versions["jupyterlab_widgets"] = "3.0.17"
    assert doctor.check_widgets().status == doctor.PASS


def test_a_missing_or_mismatched_bqplot_frontend_fails_with_the_fix(monkeypatch):
    assert doctor.check_bqplot().status == doctor.PASS  # this environment's extension matches its package
    for frontends in ([], ["0.5.44"]):
        monkeypatch.setattr(doctor, "bqplot_frontends", lambda found=frontends: found)
        result = doctor.check_bqplot()
        assert result.status == doctor.FAIL and "would not render" in result.advice
        assert "missing" in result.seen if not frontends else "0.5.44" in result.seen


def test_missing_nbval_and_a_crashing_check_are_failures_not_crashes(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "_version", lambda name: None)

    def crashes():
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor, "all_checks", lambda: [doctor.check_nbval, crashes, doctor.check_python])
    assert doctor.main() == 1
    out = capsys.readouterr().out
    assert "pip install nbval" in out and "RuntimeError: boom" in out and "2 of 3 checks failed" in out


def test_a_machine_with_other_bits_is_told_what_that_means(monkeypatch):
    from commhooks_lab.launcher import fingerprint

    seen = {**fingerprint.reference(), "aten_kernels": "AVX2"}
    seen["parts"] = {**seen["parts"], "conv": "0" * 16}
    monkeypatch.setattr(fingerprint, "in_child", lambda: seen)
    result = doctor.check_numerics()
    assert result.status == doctor.INFO and "conv differs: a convolution's forward and backward (oneDNN)" in result.seen
    assert "strict nbval fails here" in result.advice and "--lab-tolerant" in result.advice
    monkeypatch.setenv("COMMHOOKS_LAB_NUMERICS", "native")
    assert doctor.check_numerics().advice.startswith("unset COMMHOOKS_LAB_NUMERICS")


def test_another_torch_that_gives_the_reference_bits_passes_and_the_verdict_is_the_digests(monkeypatch):
    """A CUDA build of a newer torch gave all six reference digests: the doctor compares them, not version strings."""
    from commhooks_lab.launcher import fingerprint

    ref = fingerprint.reference()
    seen = {**ref, "torch": "2.14.1+cu130"}
    monkeypatch.setattr(fingerprint, "in_child", lambda: seen)
    result = doctor.check_numerics()
    assert result.status == doctor.PASS, result
    assert f"all {len(ref['parts'])} parts" in result.seen and "torch 2.14.1+cu130" in result.seen
    seen["parts"] = {**ref["parts"], "mlp": "0" * 16}
    result = doctor.check_numerics()
    assert result.status == doctor.INFO and "mlp differs" in result.seen and "conv differs" not in result.seen
    assert f"torch 2.14.1+cu130 on {ref['machine']}, the reference is torch {ref['torch']}" in result.seen


def test_the_bf16_verdict_is_what_ddp_did_on_this_build_not_what_the_device_suggests(monkeypatch):
    """DDP's check reads the build: the doctor tries the hook in a child, whatever torch.cuda.is_available() says."""
    import torch

    from commhooks_lab import _compat

    device = torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: not device)  # what the old guess read
    result = doctor.check_bf16_hook()
    refusal = _compat.bf16_refusal()
    assert result.status == doctor.INFO, result
    build = "a CPU build" if torch.version.cuda is None and torch.version.hip is None else " build with NCCL "
    assert build in result.seen, result.seen
    if refusal is None:
        assert "DDP accepts bf16_compress_hook" in result.seen and "came back rounded to bfloat16" in result.seen
    else:
        assert "DDP refuses bf16_compress_hook" in result.seen and refusal in result.seen


def test_a_cuda_build_without_a_gpu_is_shown_the_cpu_only_build(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    result = doctor.check_accelerator()
    assert result.status == doctor.INFO and "on a CUDA 13.0 build" in result.seen
    assert "setup_venv.py --cpu" in result.advice and "download.pytorch.org/whl/cpu" in result.advice
    monkeypatch.setattr(torch.version, "cuda", None)
    assert doctor.check_accelerator().advice == ""


def test_the_doctor_says_whether_another_account_can_reach_the_ranks(monkeypatch):
    from commhooks_lab.launcher import isolation

    if isolation.why_not_isolated("gloo", "forkserver") is None:  # this machine allows user namespaces
        assert doctor.check_private_network().status == doctor.PASS
    monkeypatch.setenv(isolation.VARIABLE, "0")
    shared = doctor.check_private_network()
    assert shared.status == doctor.INFO and "any local account can connect" in shared.seen
    assert "COMMHOOKS_LAB_PRIVATE_NETWORK='0' asks for this machine's loopback" in shared.seen
    monkeypatch.setenv(isolation.VARIABLE, "perhaps")
    assert doctor.check_private_network().status == doctor.FAIL


def test_links_say_which_sections_replay_recordings_where_namespaces_are_refused(monkeypatch):
    from commhooks_lab.launcher import netns_switch

    if netns_switch.why_unavailable() is None:  # this machine builds links
        assert doctor.check_links().status == doctor.PASS
    refused = {"refused": "user namespaces are refused here", "way_out": "ask the owner", "netem": False}
    monkeypatch.setattr(netns_switch, "facts", lambda: refused)
    result = doctor.check_links()
    assert result.status == doctor.INFO and "user namespaces are refused here" in result.seen
    assert "notebook 8" in result.seen and "notebook 12" in result.seen, result.seen
    assert result.advice.startswith("ask the owner") and "Docker" in result.advice, result.advice
