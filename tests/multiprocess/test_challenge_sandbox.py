"""Submissions the lab did not write, scored in its sandbox: a folder gives the same leaderboard page twice, each
cheating kind of issue 51 is refused with its reason, a fair entry's score is the one its author gets in-process;
and what still holds on a machine without user namespaces. (Each sandboxed run starts Python, torch and two ranks:
the folder here holds one fair entry, the cheats the screen refuses, and the two that only the budgets stop.)"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commhooks_lab.challenge.leaderboard import PAGE, build, leaderboard
from commhooks_lab.challenge.sandbox import Budget, score_file
from commhooks_lab.challenge.score import score
from commhooks_lab.challenge.tasks import ChallengeTask
from commhooks_lab.launcher import netns_switch

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

SUBMISSIONS = Path(__file__).parents[1] / "challenge_submissions"
TASKS = (ChallengeTask("cnn", steps=2),)
BUDGET = Budget(wall_s=120, stall_s=4, memory_bytes=2 << 30)

#: Each cheating entry and the start of the reason it must get.
SCREENED = {
    "forks": "refused before it ran: line 3: import os: forks or runs other processes",
    "patches_the_counter": "refused before it ran: line 5: assigns to dist.all_reduce: patches a library",
    "reads_the_reference": "refused before it ran: line 3: import gc: reaches into other code's objects",
    "talks_to_the_network": "refused before it ran: line 3: import socket: talks to the network",
    "writes_outside": "refused before it ran: line 5: open: touches files outside its folder",
}
BUDGETED = {
    "allocates_without_bound": "ran out of its memory budget of 2 GiB",
    "runs_forever": "ran past its time budget: no step finished within 4 s",
}


def _folder(tmp_path: Path, names) -> Path:
    for name in names:
        shutil.copy(SUBMISSIONS / f"{name}.py", tmp_path / f"{name}.py")
    return tmp_path


def test_the_same_folder_gives_the_same_page_and_a_learner_their_own_score(tmp_path, cluster):
    folder = _folder(tmp_path, ["fp16_by_hand", *SCREENED])
    first = leaderboard(folder, tasks=TASKS, budget=BUDGET, baselines=False).read_bytes()
    scores = {s.label: s for s in build(folder, tasks=TASKS, budget=BUDGET, baselines=False)}
    second = leaderboard(folder, out=tmp_path / "again.html", tasks=TASKS, budget=BUDGET, baselines=False)
    assert second.read_bytes() == first  # no timestamp, no path, no timing in what the page shows
    for label, reason in SCREENED.items():
        assert scores[label].value is None and scores[label].disqualified.startswith(reason), scores[label]
    page = first.decode()
    assert page.index("fp16_by_hand") < min(page.index(label) for label in SCREENED)
    assert "<script" not in page and "src=" not in page and (folder / PAGE).exists()
    from challenge_submissions import fp16_by_hand  # the author's own copy (tests/ is on the ranks' path too)

    own = score(fp16_by_hand.hook, tasks=TASKS, cluster=cluster)
    assert own.value is not None and own.fingerprint == scores["fp16_by_hand"].fingerprint
    assert own.fingerprint in page


def test_under_another_seed_set_the_sandbox_scores_what_the_learner_scores(monkeypatch):
    """The sandbox's clean environment keeps what the bits depend on: a learner under a seed set, and their
    sandbox, score the same task set (named so) to the same fingerprint. (Ranks read the seed set when they
    start, as a notebook's do when Jupyter starts with it: fresh ones here.)"""
    monkeypatch.setenv("COMMHOOKS_LAB_SEED_SET", "1")
    from challenge_submissions import fp16_by_hand

    sandboxed = score_file(SUBMISSIONS / "fp16_by_hand.py", tasks=TASKS, budget=BUDGET)
    own = score(fp16_by_hand.hook, tasks=TASKS, fresh=True)
    assert own.task_set.endswith("seed set 1") and sandboxed.task_set == own.task_set
    assert own.fingerprint == sandboxed.fingerprint


def test_the_ranks_run_under_the_interpreter_the_instructor_names(tmp_path, cluster):
    """``rank_python`` (``--rank-python``): every rank is spawned with it, as qemu's other CPU would run them; one
    that exits shows it is used, one that execs this Python scores what the learner scores."""
    failing, passing = tmp_path / "fails", tmp_path / "python"
    failing.write_text("#!/bin/sh\nexit 3\n")
    passing.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for wrapper in (failing, passing):
        wrapper.chmod(0o755)
    entry = SUBMISSIONS / "fp16_by_hand.py"
    refused = score_file(entry, tasks=TASKS, budget=BUDGET, rank_python=str(failing))
    assert refused.value is None and "rank 0 exited with code 3 while starting" in refused.disqualified
    from challenge_submissions import fp16_by_hand

    wrapped = score_file(entry, tasks=TASKS, budget=BUDGET, rank_python=str(passing))
    assert wrapped.fingerprint == score(fp16_by_hand.hook, tasks=TASKS, cluster=cluster).fingerprint


def test_what_gets_past_the_screen_meets_the_budgets(tmp_path):
    scores = {s.label: s for s in build(_folder(tmp_path, BUDGETED), tasks=TASKS, budget=BUDGET, baselines=False)}
    for label, reason in BUDGETED.items():
        assert scores[label].value is None and scores[label].disqualified.startswith(reason), scores[label]
    assert "rank 0 raised RuntimeError" in scores["allocates_without_bound"].disqualified
    assert "Traceback" not in scores["allocates_without_bound"].disqualified  # no install paths in a reason


#: What gets past the screen meets the namespaces: it tries the network, a file outside its folder and a fork,
#: then says what it got (a submission speaks only through the reason it fails with).
ESCAPES = """
import os, socket, time
got = []
for attempt in (lambda: socket.create_connection(("192.0.2.1", 9000), timeout=2),
                lambda: open("/tmp/hook_challenge_was_here", "w")):
    try:
        attempt()
        got.append("done")
    except OSError as exc:
        got.append(exc.strerror)
if os.fork() == 0:
    time.sleep(3600)
raise RuntimeError("; ".join(got))
"""


def test_the_namespaces_hold_what_gets_past_the_screen():
    from commhooks_lab.challenge.sandbox import isolation, score_submission
    from commhooks_lab.challenge.submission import Submission

    if not isolation()[0]:
        pytest.skip("no user namespaces here: the screen alone guards the network and the files")
    marked = Budget(wall_s=120, stall_s=4.125, memory_bytes=2 << 30)  # its stall_s marks its processes' command line
    scored = score_submission(Submission("escapes", ESCAPES), TASKS, marked, screened=False)
    assert scored.disqualified == ("failed to load: RuntimeError: Network is unreachable; Read-only file system"), (
        scored.disqualified
    )
    assert not Path("/tmp/hook_challenge_was_here").exists()
    import psutil

    forked = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "commhooks_lab.challenge.sandbox" in " ".join(p.info["cmdline"] or [])
        and '"stall_s": 4.125' in " ".join(p.info["cmdline"] or [])
    ]
    assert forked == []  # the fork died with its PID namespace


NO_USER_NAMESPACES = 'echo 0 > /proc/sys/user/max_user_namespaces; exec "$@"'
WITHOUT_NAMESPACES = """
import json
from commhooks_lab.challenge.sandbox import Budget, isolation, score_submission
from commhooks_lab.challenge.submission import Submission
from commhooks_lab.challenge.tasks import ChallengeTask
from commhooks_lab.launcher import netns_switch
looping = Submission("loops_at_import", "while True:\\n    pass\\n")
scored = score_submission(looping, (ChallengeTask("cnn", steps=2),), Budget(wall_s=6, stall_s=4))
print(json.dumps({"isolated": isolation()[0], "note": isolation()[1], "reason": scored.disqualified}))
"""


def test_without_user_namespaces_the_budgets_and_the_session_still_hold():
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-r", "true"]).returncode != 0:
        pytest.skip("this machine gives no user namespace to take them away in")
    command = ["unshare", "-r", "sh", "-c", NO_USER_NAMESPACES, "sh", sys.executable, "-c", WITHOUT_NAMESPACES]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["isolated"] is False
    assert report["note"].startswith("no namespaces (unshare: ") and "guarded by the screen alone" in report["note"]
    assert report["reason"] == "ran past its time budget of 6 s (runs forever?)"


@pytest.mark.skipif(netns_switch.why_unavailable() is not None, reason="no links here: they need user namespaces")
def test_the_sandbox_times_an_entry_behind_a_real_link_inside_its_own_namespaces():
    """The ranks' private network is built inside the sandbox's PID namespace (its own /proc): the times come back
    beside the score, which they leave as it is."""
    timed = score_file(SUBMISSIONS / "fp16_by_hand.py", tasks=TASKS, budget=BUDGET, link="1gbit")
    plain = score_file(SUBMISSIONS / "fp16_by_hand.py", tasks=TASKS, budget=BUDGET)
    assert timed.fingerprint == plain.fingerprint and timed.value == plain.value
    (row,) = timed.measured
    assert "unmeasured" not in row, row
    assert row["link"] == "1gbit" and 0 < row["hook"]["min_ms"] <= row["hook"]["median_ms"]
