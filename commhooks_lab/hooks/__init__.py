"""Hooks: the registry of every hook, wrapper and compressor family, the families themselves (one per
file, each registering its records here), the byte rules, the parser of a line-up item, and the contract
a hook's Future must meet. May import: ``_compat``, ``_util``. Nothing that runs.
"""

# register the built-in families on first use of hooks/, in the order tables list them
from . import default, powersgd, debugging, wrappers, wire16, compressor_entries, local_sgd, hierarchical_entries  # noqa: F401, I001

__all__: list[str] = []
