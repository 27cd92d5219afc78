"""Measurement inside a rank: the probe that wraps a hook, its float64 sums, the payload counter, scratch memory.
May import: ``hooks``, ``_compat``, ``_util``.
"""

__all__: list[str] = []
