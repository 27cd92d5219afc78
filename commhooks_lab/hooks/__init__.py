"""Hooks: the registry of every hook, wrapper and compressor family, the families themselves, the parser of a
line-up item, and the contract a hook's Future must meet. May import: ``_compat``, ``_util``. Nothing that runs.
"""

__all__: list[str] = []
