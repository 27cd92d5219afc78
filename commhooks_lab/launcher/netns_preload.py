"""Imported first by a rank server that hosts the ranks' private network: it enters it at import.

A forkserver's only hook before it forks is the list of modules it imports (``set_forkserver_preload``);
entering a user namespace needs a process with one thread, which the server still is before torch loads.
Anywhere else (no ``COMMHOOKS_LAB_NETWORK_HOST=1`` in the environment) importing it does nothing.
"""

from __future__ import annotations

import os

from . import netns_switch

if os.environ.pop(netns_switch.HOST_VARIABLE, None) == "1":
    netns_switch.host()
