"""Memory the probe reuses: between flushes, and between runs in a warm rank.

On Linux a fresh large tensor is mapped page by page on first touch. For an 11M-parameter
model that costs more than the measuring itself (here: a fresh 88 MB float64 copy ~140 ms, a
copy into a reused buffer ~5 ms). A :class:`Scratch` hands out buffers by name, shape and
dtype; when its owner is garbage-collected they go back to a process-wide spare set, so the
next run in the same rank (a warm ``Cluster``) starts with its memory already mapped. The
spare set holds the latest run's buffers (about 40 bytes per parameter on rank 0, 8 on the
others) and earlier ones up to ``KEEP_BYTES``.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["KEEP_BYTES", "Scratch"]

_Key = tuple[tuple[int, ...], torch.dtype, torch.device]
_SPARE: dict[_Key, list[torch.Tensor]] = {}
#: Buffers of earlier runs kept besides the latest run's.
KEEP_BYTES = 1 << 30


def _key(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> _Key:
    return tuple(shape), dtype, torch.device(device)


def _from_spare(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    spare = _SPARE.get(_key(shape, dtype, device))
    if spare:
        return spare.pop()
    return torch.empty(shape, dtype=dtype, device=device)


def _give_back(named: dict[str, torch.Tensor], loose: list[torch.Tensor]) -> None:
    """Keep these buffers for the next run; older ones only while they weigh less than ``KEEP_BYTES``
    (so a run with the probe off does not evict a big model's buffers, and memory stays bounded)."""
    given: dict[_Key, list[torch.Tensor]] = {}
    for tensor in [*named.values(), *loose]:
        given.setdefault(_key(tuple(tensor.shape), tensor.dtype, tensor.device), []).append(tensor)
    older = {key: tensors for key, tensors in _SPARE.items() if key not in given}
    _SPARE.clear()
    if sum(_nbytes(tensors) for tensors in older.values()) <= KEEP_BYTES:
        _SPARE.update(older)
    _SPARE.update(given)


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Scratch:
    """Named and loose buffers on one device, handed back to the process when the owner goes."""

    def __init__(self, owner: object, device: torch.device):
        self.device = device
        self._named: dict[str, torch.Tensor] = {}
        self._loose: list[torch.Tensor] = []
        weakref.finalize(owner, _give_back, self._named, self._loose)

    def has(self, name: str) -> bool:
        return name in self._named

    def named(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The buffer called ``name``, kept between calls (contents included) while its shape and dtype hold."""
        buffer = self._named.get(name)
        if buffer is None or tuple(buffer.shape) != tuple(shape) or buffer.dtype != dtype:
            if buffer is not None:
                self._loose.append(buffer)
            buffer = self._named[name] = self._take(tuple(shape), dtype)
        return buffer

    def swap(self, first: str, second: str) -> None:
        self._named[first], self._named[second] = self._named[second], self._named[first]

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A loose buffer (contents undefined); hand it back with :meth:`give`."""
        return self._take(tuple(shape), dtype)

    def give(self, tensor: torch.Tensor) -> None:
        self._loose.append(tensor)

    def _take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        for i, tensor in enumerate(self._loose):
            if tuple(tensor.shape) == shape and tensor.dtype == dtype:
                return self._loose.pop(i)
        return _from_spare(shape, dtype, self.device)
