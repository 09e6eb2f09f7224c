"""A DataLoader worker's default collate in a mode: samples with history stacked as their detached copies.

In a worker process, torch's `collate_tensor_fn` (the default collate's entry for tensors,
`torch.utils.data._utils.collate.default_collate_fn_map[torch.Tensor]`) stacks the samples into
a tensor it makes in shared memory first (`torch.stack(batch, 0, out=...)`, to spare the batch a
copy on its way to the main process), and autograd refuses that for samples with history
("functions with out=... arguments don't support automatic differentiation").  A batch with
history could not leave the worker anyway: it is pickled by torch's multiprocessing, which
refuses tensors with history (see `_sending`).

While the shim is installed (see `_patch`), that map entry, where it is torch's function, is a
wrapper of it.  In a worker where a mode applies, when a sample has history:

- silent, warn: the samples' detached copies are collated by torch's function, into its shared
  memory, and the batch requires grad if stacking the samples would give a batch that does (a
  sample requires grad and grad mode is on); warn names the samples in one
  `DetachedTensorsWarning` (`[i]`: the sample's place in the batch);
- strict: `NonLeafTensorError` where torch raises, with torch's error as its cause.

Anywhere else (the main process, no mode, no sample with history) it is torch's function,
called as it is called.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from . import _modes, _report
from ._access import Entry
from ._errors import DetachedTensorsWarning, NonLeafTensorError
from ._modes import Mode
from ._notices import warn_in_user_code

__all__ = ["CollatePatch"]

# pytest leaves this module's frames out of the tracebacks it shows (strict raises here).
__tracebackhide__ = True

_Collate = Callable[..., Any]


class CollatePatch:
    """One installation's change to the default collate's map: made outside the patch's lock
    (reading what is there), applied and removed under it (see `_patch`).

    Only torch's own `collate_tensor_fn` is wrapped: an entry someone else put there is theirs,
    and is left alone (their function may not stack into shared memory)."""

    __slots__ = ("table", "entry", "original", "patch")

    def __init__(self) -> None:
        from torch.utils.data._utils import collate

        self.table: Dict[Any, _Collate] = collate.default_collate_fn_map
        self.original: _Collate = collate.collate_tensor_fn
        self.entry: Optional[_Collate] = self.table.get(torch.Tensor)
        self.patch = _collate(self.original)

    def unchanged(self) -> bool:
        """True if the entry this patch read is still there."""
        return self.table.get(torch.Tensor) is self.entry

    def apply(self) -> None:
        """Write the entry, where it is torch's function."""
        if self.entry is self.original:
            self.table[torch.Tensor] = self.patch

    def remove(self) -> List[str]:
        """Restore the entry where it is still ours; return its name if someone replaced it."""
        if self.entry is not self.original:
            return []
        if self.table.get(torch.Tensor) is self.patch:
            self.table[torch.Tensor] = self.original
            return []
        return ["torch.utils.data._utils.collate.default_collate_fn_map[torch.Tensor]"]


def _collate(original: _Collate) -> _Collate:
    """The wrapper of torch's `collate_tensor_fn` (`original`) that the map holds."""
    from torch.utils.data import get_worker_info

    current_setting = _modes.current_setting

    def collate_tensor_fn(batch: Any, *args: Any, **kwargs: Any) -> Any:
        setting = current_setting()
        if setting is None or get_worker_info() is None:
            return original(batch, *args, **kwargs)
        history = [index for index, sample in enumerate(batch)
                   if isinstance(sample, torch.Tensor) and sample.requires_grad and not sample.is_leaf]
        if not history:
            return original(batch, *args, **kwargs)
        found = [Entry(batch[index], f"[{index}]", None) for index in history]
        if setting.mode is Mode.STRICT:
            try:
                return original(batch, *args, **kwargs)  # torch refuses: its very error
            except RuntimeError as exc:
                raise NonLeafTensorError(
                    _report.collate_refusal(setting, found, str(exc)), paths=[e.label for e in found],
                    mode=Mode.STRICT, tensors=[e.tensor for e in found]) from exc
        requires_grad = torch.is_grad_enabled() and any(
            isinstance(sample, torch.Tensor) and sample.requires_grad for sample in batch)
        detached = [sample.detach() if isinstance(sample, torch.Tensor) else sample for sample in batch]
        collated = original(detached, *args, **kwargs)
        if requires_grad:
            collated.requires_grad_(True)
        if setting.mode is Mode.WARN:
            warn_in_user_code(DetachedTensorsWarning(
                _report.collate_detached_warning(setting, found, requires_grad),
                [e.label for e in found], [e.tensor for e in found]))
        return collated

    # Named and documented as torch's, unwrapping to it (as the tensor patch is: see `_tensor`).
    collate_tensor_fn.__wrapped__ = original  # type: ignore[attr-defined]
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(collate_tensor_fn, name, getattr(original, name, None))
    return collate_tensor_fn
