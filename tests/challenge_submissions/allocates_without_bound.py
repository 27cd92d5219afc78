"""Cheat: keeps every gradient it ever saw, and more."""

import torch


def hook(state, bucket):
    hoard = []
    while True:
        hoard.append(torch.empty(1 << 28))
