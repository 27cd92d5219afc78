"""A learner's runs, played by an unprivileged account while another one attacks (see ``gloo_attacker.py``).

argv: mode. ``hijack``: four fresh Clusters, one short fp16 run each. ``flood``: one warm Cluster (started
while the attacker floods), a run, then "ready" on stdout; after a line on stdin (the attack is over), another
run. Prints one JSON line: each run's parameter digest or error and seconds, the ranks' open fds before and
after, starts, and whether the ranks were in a network namespace of their own.
"""

import json
import os
import sys
import time

import commhooks_lab as lab


def timed_run(cluster=None) -> dict:
    start = time.monotonic()
    try:
        result = lab.run(hook="fp16", steps=4, fresh=cluster is None, cluster=cluster)
    except Exception as exc:  # the test reports it: this is what the attack did
        return {"error": f"{type(exc).__name__}: {exc}"[:400], "seconds": time.monotonic() - start}
    return {"digest": result.final["param_digests"][0], "seconds": time.monotonic() - start}


def fds(pids: list) -> list:
    return [len(os.listdir(f"/proc/{pid}/fd")) for pid in pids]


def main() -> None:
    mode = sys.argv[1]
    report = {"uid": os.getuid()}
    if mode == "hijack":
        report["runs"] = [timed_run() for _ in range(4)]
    else:
        with lab.Cluster(world_size=2) as cluster:
            own = os.readlink("/proc/self/ns/net")
            report["private"] = all(os.readlink(f"/proc/{pid}/ns/net") != own for pid in cluster.pids)
            report["runs"] = [timed_run(cluster)]
            report["fds_before"] = fds(cluster.pids)
            print("ready", flush=True)
            sys.stdin.readline()
            report["runs"].append(timed_run(cluster))
            report["fds_after"] = fds(cluster.pids) if cluster.alive else None
            report["starts"] = cluster.starts
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
