"""The notebook's rendezvous store, listening on 127.0.0.1 only.

``TCPStore("127.0.0.1", 0, is_master=True)`` listens on every interface whatever host it is
given: on a workshop's shared Wi-Fi that is an unauthenticated store open to the room for as
long as a warm Cluster lives. So the lab binds the socket itself, on loopback, and hands it over.
"""

from __future__ import annotations

import socket
from datetime import timedelta

LOOPBACK = "127.0.0.1"


def loopback_store(timeout_s: float):
    """A master ``TCPStore`` on a port the OS picks, reachable from this machine only."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(128)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the socket from here on and closes it
    # use_libuv=False: the libuv server cannot adopt a listening socket (master_listen_fd).
    return dist.TCPStore(
        LOOPBACK,
        port,
        None,
        True,
        timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=False,
    )
