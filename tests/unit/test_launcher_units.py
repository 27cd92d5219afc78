"""The launcher's small pieces, without processes: heartbeat bookkeeping, the device rule, stderr files."""

import os

import pytest
import torch

from commhooks_lab.launcher.devices import backend_and_device
from commhooks_lab.launcher.errors import explain_death
from commhooks_lab.launcher.rank_logs import RankLog, stderr_into
from commhooks_lab.launcher.step_watch import StepWatch


def test_a_rank_behind_is_reported_every_interval_until_it_catches_up():
    watch = StepWatch(3)
    for rank in range(3):
        watch.beat(rank, 2, now=100.0)
    watch.beat(0, 3, now=101.0)
    watch.beat(2, 3, now=101.5)
    assert watch.behind() == [1]
    assert watch.longest_step_s == 1.5  # rank 2's step 2: the watchdog waits this much longer
    assert watch.stall_message(105.0, every_s=10, timeout_s=30) is None
    first = watch.stall_message(111.0, every_s=10, timeout_s=30)
    assert first.startswith("commhooks_lab: rank 1 has not reached step 3 for 10 s (ranks [0, 2] did, and waits)")
    assert "timeout_s=30 s" in first
    assert watch.stall_message(115.0, every_s=10, timeout_s=30) is None  # once per interval
    assert "for 20 s" in watch.stall_message(121.0, every_s=10, timeout_s=30)
    watch.beat(1, 3, now=122.0)
    assert watch.behind() == []
    assert watch.stall_message(125.0, every_s=10, timeout_s=30) is None
    assert "no rank has gone past step 3 for 10 s" in watch.stall_message(132.0, every_s=10, timeout_s=30)


def test_no_heartbeats_means_no_messages_and_no_verdict():
    watch = StepWatch(2)
    assert not watch.active
    assert watch.stall_message(1e6, every_s=10, timeout_s=30) is None
    assert watch.verdict([0, 1], timeout_s=30) is None


def test_the_verdict_names_the_rank_behind_then_the_silent_one_then_the_one_that_returned():
    behind = StepWatch(2)
    behind.beat(0, 4, 0.0)
    behind.beat(1, 3, 0.0)
    v = behind.verdict(silent=[1], timeout_s=5)
    assert (v.ranks, v.step) == ([1], 4)
    assert v.summary.startswith("never reached step 4: it last reported step 3, while rank 0 waited for it")

    silent = StepWatch(3)
    for rank in range(3):
        silent.beat(rank, 7, 0.0)
    v = silent.verdict(silent=[2], timeout_s=5)
    assert (v.ranks, v.step) == ([2], 7)
    assert "stopped answering in step 7 and never joined the collective that ranks [0, 1] waited in" in v.summary
    # all silent and no collective timed out: they wait outside torch.distributed, not for one rank
    everyone = silent.verdict(silent=[0, 1, 2], timeout_s=5)
    assert "as did every rank, with no collective timing out" in everyone.summary
    assert silent.verdict(silent=[0, 1, 2], timeout_s=5, timed_out=frozenset({0})) is None  # nothing points at one

    returned = StepWatch(2)
    returned.beat(0, 9, 0.0)
    returned.beat(1, 9, 0.0)
    returned.finished(1)
    v = returned.verdict(silent=[], timeout_s=5)
    assert (v.ranks, v.step) == ([1], 9)
    assert v.summary.startswith("returned after step 9 while rank 0 still waited for it in a collective")


def test_backend_and_device_follow_one_rule():
    cuda = torch.cuda.is_available()
    backend, device = backend_and_device(None, local_rank=0)
    assert (backend, device.type) == (("nccl", "cuda") if cuda else ("gloo", "cpu"))
    assert backend_and_device("gloo", local_rank=5) == ("gloo", torch.device("cpu"))
    too_many = torch.cuda.device_count() if cuda else 0
    with pytest.raises(RuntimeError, match=f"LOCAL_RANK={too_many} and its node has {too_many} CUDA device"):
        backend_and_device("nccl", local_rank=too_many)


def test_a_rank_log_keeps_the_last_lines_and_forwards_each_byte_once(capfd):
    log = RankLog(0)
    try:
        with stderr_into(log.path):
            os.write(2, "".join(f"line {i}\n" for i in range(30)).encode())
        os.write(2, b"after\n")  # fd 2 is ours again
        log.detach()
        assert not os.path.exists(log.path)
        assert log.tail().splitlines() == [f"line {i}" for i in range(10, 30)]
        assert log.tail(2) == "line 28\nline 29"
        capfd.readouterr()
        log.forward()
        log.forward()
        assert capfd.readouterr().err == "".join(f"line {i}\n" for i in range(30))
    finally:
        log.remove()
    assert log.tail() == ""


def test_a_rank_log_forwards_a_large_output_in_bounded_chunks(capfdbinary, monkeypatch):
    from commhooks_lab.launcher import rank_logs

    log = RankLog(0)
    written = os.urandom(5 * rank_logs.FORWARD_CHUNK + 123)
    reads: list[int] = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: reads.append(n) or pread(fd, n, offset))
    try:
        with stderr_into(log.path):
            os.write(2, written)
        capfdbinary.readouterr()
        log.forward()
        assert capfdbinary.readouterr().err == written  # every byte, once, in order
        assert max(reads) <= rank_logs.FORWARD_CHUNK and sum(reads) == len(written)
    finally:
        log.remove()


def test_only_the_bootstrap_error_is_explained_as_a_missing_main_guard():
    assert explain_death("Segmentation fault") is None
    text = explain_death("RuntimeError:\n  current process has finished its bootstrapping phase.")
    assert 'if __name__ == "__main__":' in text


def test_a_task_whose_pipe_is_closed_mid_write_is_left_unsent_without_a_thread_exception(monkeypatch):
    """Stopping a rank closes its pipe while its task may still be going out: multiprocessing writes a large
    message's length, then its body, and a close between the two leaves the second write a handle of None (a
    TypeError in the sending thread, which a suite run showed as a warning)."""
    import threading
    from multiprocessing import Pipe

    from commhooks_lab.launcher.cluster import _Delivery

    raised: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    reader, writer = Pipe(duplex=False)
    os.set_blocking(writer.fileno(), False)
    with pytest.raises(BlockingIOError):
        while True:  # fill the pipe, so the length's write blocks
            os.write(writer.fileno(), b"f" * 4096)
    os.set_blocking(writer.fileno(), True)
    delivery = _Delivery([writer], b"x" * (1 << 20))
    sending = delivery._threads[0]
    sending.join(0.5)
    assert sending.is_alive()  # blocked writing the length
    writer.close()  # what stopping the rank does
    while sending.is_alive():  # reading frees room: the length goes out, then the body's write finds no handle
        if reader.poll(0.05):
            os.read(reader.fileno(), 1 << 16)
    reader.close()
    assert raised == []
    assert delivery.unsent() == [0]


@pytest.mark.parametrize("start", ["launch", "Cluster"])
def test_a_timeout_too_short_for_ranks_to_meet_is_refused_before_any_rank_starts(start):
    """gloo rounds 1e-9 s down to 0 ms: every rank would time out at once, each with its own traceback."""
    import commhooks_lab as lab

    with pytest.raises(ValueError, match=r"timeout_s=1e-09 is shorter than the ranks can meet in"):
        if start == "launch":
            lab.launch(os.getpid, world_size=2, timeout_s=1e-9)
        else:
            lab.Cluster(2, timeout_s=1e-9)
