"""Cheat: never returns (the step never ends)."""


def hook(state, bucket):
    while True:
        pass
