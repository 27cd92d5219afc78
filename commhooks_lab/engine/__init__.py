"""The per-rank job: the experiment's config, task and data, DDP / Accelerate / FSDP2 set-up, the training loop,
checkpoint and resume. May import: ``launcher``, ``hooks``, ``measure``, ``_compat``, ``_util``.
"""

__all__: list[str] = []
