"""What a tensor with history takes of its storage into its copy.

torch copies a leaf through its storage: the whole storage, memoised (`memo["torch"]`, keyed by
the storage), so that tensors sharing a storage share one in the copy.  A tensor with history
copied that way would take its whole base along: a slice of a large activation (the first
token of every sequence, cached for later) would copy the whole activation.  So a plain tensor
with history whose elements are only part of its storage takes only those:

- alone, a dense one (its elements one block of its storage: contiguous, permuted, expanded)
  gets a new storage holding that block, its strides kept; one with gaps between its elements
  (every sequence's first token) is copied as `clone()` copies it, its elements packed;
- where this copy holds a copy of the whole storage already (another tensor of that storage
  came first), it shares that one, as torch does;
- with other tensors of the same storage in the same copy, they share one new storage holding
  the part they all span (the copies made before are moved onto it), so that tensors sharing
  a storage still share one in the copy, with their own strides;
- where the whole storage is copied later in the same copy, the tensors copied before are moved
  onto that copy once the copy is complete (`Spans.settle`).

So a tensor with history copied alone allocates what `t.detach().clone()` allocates, and the
copy of several tensors of one storage no more than the part of it they span.  Subclasses,
sparse, quantized and nested tensors, and devices torch copies by cloning, are copied as torch
copies them.  The source is never touched.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = ["Spans"]

_DEVICES = ("cpu", "cuda")
_Copied = Tuple[torch.Tensor, int, Tuple[int, ...]]  # a copy, its source's byte offset and strides


class _Part:
    """What one copy, with one memo, took of one source storage: the bytes [start, end) it
    spans, the new storage holding them (None while a single tensor with gaps holds only its
    own elements), and the copies made of that storage's tensors."""

    __slots__ = ("source", "memo", "start", "end", "storage", "copies")

    def __init__(self, source: Any, memo: Any, start: int, end: int) -> None:
        self.source = source  # the source's storage: alive as long as its key is looked up
        self.memo = memo  # and the memo (torch's storage memo is the memo's): alive likewise
        self.start, self.end = start, end
        self.storage: Any = None
        self.copies: List[_Copied] = []


class Spans:
    """The storages one copy took in part (see the module docstring), by memo and source
    storage: as torch's own storage memo, which is the memo's, a copy a `__deepcopy__` makes
    with a memo of its own shares nothing with the rest."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: Dict[Tuple[int, int], _Part] = {}

    def twin(self, alias: torch.Tensor, memo: Any) -> Optional[torch.Tensor]:
        """A twin of `alias` (a detached alias of a tensor with history, without conj or neg
        bits) on the storage its copy takes (its own, already the copy's); None where the copy
        takes the whole storage, the way torch takes it.  Call `made` with the copy torch
        makes of the twin."""
        span = _span(alias)
        if span is None:
            return None
        start, end = span
        source = alias.untyped_storage()
        whole = _torch_memo(memo)
        if whole is not None and source._cdata in whole:
            return None  # this copy holds the whole storage already: shared, as torch shares it
        key = (id(memo), source._cdata)
        part = self.parts.get(key)
        if part is None:
            if end - start >= source.nbytes():
                return None  # it takes all of it
            part = self.parts[key] = _Part(source, memo, _aligned(start), end)
            if end - start > alias.numel() * alias.element_size():
                return alias.clone()  # gaps between its elements: only they, packed
            part.storage = _take(source, part.start, end, alias.device)
        elif part.storage is None or start < part.start or end > part.end:
            self._grow(part, _aligned(min(start, part.start)), max(end, part.end), alias.device)
        twin = alias.detach()
        twin.set_(part.storage, _offset(alias, part.start), alias.size(), alias.stride())
        return twin

    def made(self, alias: torch.Tensor, memo: Any, copied: torch.Tensor) -> None:
        """`copied` is torch's copy of the twin of `alias` with `memo`: moved with its part, if
        it moves."""
        offset = int(alias.storage_offset()) * alias.element_size()
        part = self.parts[(id(memo), alias.untyped_storage()._cdata)]
        part.copies.append((copied, offset, alias.stride()))

    def settle(self) -> None:
        """The copy is complete: the copies made of tensors of a storage that the copy also
        copied whole, with the same memo, are moved onto that whole copy, to share it as
        torch's own copies do."""
        for part in self.parts.values():
            whole = _torch_memo(part.memo)
            storage = whole.get(part.source._cdata) if whole is not None else None
            if storage is not None:
                _move(part.copies, storage, 0)
        self.parts.clear()

    def _grow(self, part: _Part, start: int, end: int, device: torch.device) -> None:
        storage = _take(part.source, start, end, device)
        _move(part.copies, storage, start)
        part.start, part.end, part.storage = start, end, storage


def _span(alias: torch.Tensor) -> Optional[Tuple[int, int]]:
    """The bytes [start, end) of its storage a plain dense tensor that torch copies through
    its storage touches; None for any other tensor."""
    if (type(alias) is not torch.Tensor or alias.layout is not torch.strided or alias.is_quantized
            or alias.is_nested or alias.device.type not in _DEVICES
            or not torch._C._has_storage(alias)):
        return None
    size = alias.element_size()
    start = int(alias.storage_offset()) * size
    if alias.numel() == 0:
        return start, start
    last = sum((int(n) - 1) * step for n, step in zip(alias.size(), alias.stride()))
    return start, start + (last + 1) * size


def _aligned(start: int) -> int:
    """`start` rounded down to a multiple of 64 bytes: a storage beginning there holds every
    tensor of the source's storage at a whole number of its elements (storage offsets are
    counted in elements, of at most 16 bytes)."""
    return start - start % 64


def _offset(tensor: torch.Tensor, start: int) -> int:
    """`tensor`'s storage offset on a storage that begins at byte `start` of its source's."""
    return (int(tensor.storage_offset()) * tensor.element_size() - start) // tensor.element_size()


def _take(source: Any, start: int, end: int, device: torch.device) -> Any:
    """A new storage holding bytes [start, end) of `source`."""
    with torch.no_grad():
        part = torch.empty(0, dtype=torch.uint8, device=device)
        part.set_(source, start, (end - start,), (1,))
        return part.clone().untyped_storage()


def _move(copies: List[_Copied], storage: Any, start: int) -> None:
    """Put each copy on `storage`, which begins at byte `start` of its source's storage, where
    its source sits on that storage, with its source's strides."""
    with torch.no_grad():
        for copied, offset, stride in copies:
            copied.set_(storage, (offset - start) // copied.element_size(), copied.size(), stride)


def _torch_memo(memo: Any) -> Optional[Dict[Any, Any]]:
    """torch's own table of the storages a copy made (`memo["torch"]`), read without calling a
    memo subclass's methods; None if there is none."""
    whole = dict.get(memo, "torch") if isinstance(memo, dict) else None
    return whole if isinstance(whole, dict) else None
