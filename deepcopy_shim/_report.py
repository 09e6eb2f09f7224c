"""The words: every message deepcopy-shim shows about a copy or a send, in one place.

Rules for all of them: the first line says what happened in a few words (it is what a terminal,
a log line or a docs page shows without scrolling); the tensors follow one per line, at most
`MAX_LISTED` of them; then the mode, the way it was set, and how to change it.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from ._access import Entry
from ._errors import TorchCompatibilityWarning
from ._modes import ModeSetting
from ._names import a_name_of
from ._notices import warn_in_user_code

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_LISTED",
    "describe_tensor",
    "INSIDE_ANOTHER_COPY",
    "NOT_THE_END",
    "READ_BEFORE_THE_END",
    "SURVEY_INTERRUPTED",
    "collate_detached_warning",
    "collate_refusal",
    "detached_copy_failure",
    "detached_warning",
    "note_untested_torch_once",
    "send_detached_warning",
    "send_refusal",
    "strict_refusal",
]

MAX_LISTED = 20
_WIDTH = 88
_untested_noted = False


def describe_tensor(tensor: torch.Tensor) -> str:
    """`grad_fn=AddmmBackward0, shape=(4, 8), dtype=torch.float32` (plus the device if not CPU)."""
    grad_fn = tensor.grad_fn
    text = (
        f"grad_fn={type(grad_fn).__name__ if grad_fn is not None else None}, "
        f"shape={_shape(tensor)}, dtype={tensor.dtype}"
    )
    if tensor.device.type != "cpu":
        text += f", device={tensor.device}"
    return text


def _shape(tensor: torch.Tensor) -> str:
    """`(4, 8)`; a nested tensor has no single shape (torch raises for its sizes): `nested,
    2 tensors`; any other kind whose sizes torch will not give: its layout."""
    if getattr(tensor, "is_nested", False):
        try:
            return f"nested, {tensor.size(0)} tensors"
        except Exception:
            return "nested"
    try:
        return str(tuple(tensor.shape))
    except Exception:
        return f"unknown ({tensor.layout})"


def detached_warning(root: Any, setting: ModeSetting, entries: Sequence[Entry]) -> str:
    """Mode warn: the copy of `root` is complete and detached `entries`."""
    count = len(entries)
    return "\n".join([
        f"deepcopy_shim: deep copy of {a_name_of(root)} detached {_tensors(count)} with autograd history:",
        *_listing(entries, "all are in the warning's .paths"),
        _fill(
            "Each copy is a leaf with the same values and requires_grad, without the graph. "
            f"Mode 'warn' is set by {setting.spelled()}: {setting.spelled('silent')} copies "
            f"without this warning, {setting.spelled('strict')} refuses such copies; or detach "
            "these tensors before copying."
        ),
    ])


# strict_refusal's `incomplete` where the rest of the copy was not followed, and why (see
# `_refusal`); any other value is why the survey could not follow it.
READ_BEFORE_THE_END = "it was read before the copy that raised it ended"
NOT_THE_END = ("the copy did not end with this refusal (code inside it caught it, and the copy "
               "went on, or ended with another error or an interruption)")
INSIDE_ANOTHER_COPY = (
    "the copy ran inside another copy, where following the rest of it could call a copy "
    "method that is still running")
SURVEY_INTERRUPTED = "the survey of the copy was interrupted"
_NOT_FOLLOWED = (READ_BEFORE_THE_END, NOT_THE_END, INSIDE_ANOTHER_COPY, SURVEY_INTERRUPTED)


def _ways_out(entries: Sequence[Entry]) -> List[str]:
    """The two lines of a refusal's example, for the first tensor with a path a user can spell
    (`obj` is the object copied or sent); none where no tensor has one."""
    example = next((e for e in entries if e.why is None and e.path), None)
    if example is None:
        return []
    target = f"obj{example.path}"  # a raw path starts with "." or "["
    return [f"    {target} = {target}.detach()", f"    del {target}"]


def strict_refusal(root: Any, setting: ModeSetting, entries: Sequence[Entry],
                   incomplete: Optional[str] = None, torch_words: Optional[str] = None) -> str:
    """Mode strict: the copy of `root` would meet `entries`, so it is refused.

    `incomplete` says why the list may be short: one of `READ_BEFORE_THE_END`,
    `NOT_THE_END`, `INSIDE_ANOTHER_COPY` and `SURVEY_INTERRUPTED` (the rest of the copy was
    not followed), or what stopped the survey from following it without copying it;
    `torch_words` is torch's own refusal, kept whole on the last line so that code that looks
    for torch's words ("graph leaves") in the message still finds them.
    """
    count = len(entries)
    how = _ways_out(entries)
    lines = [
        f"deepcopy_shim: refused to copy {a_name_of(root)} holding {_tensors(count)} with autograd history:",
        *_listing(entries, "all are in the error's .paths"),
    ]
    if incomplete in _NOT_FOLLOWED:
        lines.append(_fill(
            f"The list may be incomplete: {incomplete}, so the rest of the copy was not "
            "followed. deepcopy_shim.find_nonleaf_tensors(obj) lists every tensor with "
            "history the copy would meet."
        ))
    elif incomplete is not None:
        lines.append(_fill(
            "The list may be incomplete: the rest of the copy could not be followed without "
            f"copying it ({incomplete})."
        ))
    lines += [
        _fill(
            f"Mode 'strict' is set by {setting.spelled()}. The copy was discarded; nothing in the "
            f"source was detached. {setting.spelled('warn')} or {setting.spelled('silent')} copies "
            "these tensors as detached leaves; or detach or drop them before copying"
            + (", e.g. (obj is the object copied):" if how else ".")
        ),
        *how,
    ]
    if torch_words:
        lines.append("torch's refusal: " + " ".join(torch_words.split()))
    return "\n".join(lines)


def detached_copy_failure(path: str, tensor: torch.Tensor, error: BaseException) -> str:
    """torch could not copy the detached twin of the non-leaf `tensor` at `path`."""
    cls = type(tensor)
    return "\n".join([
        f"deepcopy_shim: cannot deep-copy {path or 'the copied object'}, a tensor with autograd history:",
        _fill(
            f"torch failed to copy it even detached ({cls.__module__}.{cls.__qualname__}, "
            f"{describe_tensor(tensor)}): {type(error).__name__}: {error}"
        ),
        "Detach or drop this tensor before copying.",
    ])


def untested_torch(version: str, newest: str) -> str:
    return _fill(
        f"deepcopy_shim: torch {version} is newer than any release deepcopy-shim was tested "
        f"with (newest: {newest}). A self-check found torch's refusal of non-leaf tensors as "
        "expected, so the shim is active; please report anything odd with the output of "
        "`python -m deepcopy_shim --check`."
    )


def note_untested_torch_once() -> None:
    """Mode warn: once per process, a note if torch is newer than the tested range."""
    global _untested_noted
    if _untested_noted:
        return
    _untested_noted = True
    import torch

    from ._tested import TESTED_TORCH, tested_range_text, torch_newer_than_tested

    if torch_newer_than_tested(torch.__version__):
        newest = tested_range_text(TESTED_TORCH).split("-")[1]
        warn_in_user_code(TorchCompatibilityWarning(untested_torch(torch.__version__, newest)))


def _tensors(count: int) -> str:
    return f"{count} tensor{'s' if count != 1 else ''}"


def _fill(text: str) -> str:
    return textwrap.fill(text, _WIDTH, break_long_words=False, break_on_hyphens=False)


def _listing(entries: Sequence[Entry], where_all: str,
             itself: str = "<the copied object itself>") -> List[str]:
    """One line per tensor; tensors without a spelled path grouped under their reason; `itself`
    is what the object the paths start from is called, where it is the tensor."""
    shown = entries[:MAX_LISTED]
    lines = [f"  {e.label or itself}: {describe_tensor(e.tensor)}"
             for e in shown if e.why is None]
    # Where no path reaches the tensors, say where and why once, then list them.
    groups: Dict[str, List[str]] = {}
    for e in shown:
        if e.why is not None:
            groups.setdefault(e.label, []).append(describe_tensor(e.tensor))
    for label, described in groups.items():
        lines.append(f"  {label}: {_tensors(len(described))}")
        lines.extend(f"    {d}" for d in described)
    hidden = len(entries) - len(shown)
    if hidden:
        lines.append(f"  ... and {hidden} more ({where_all})")
    return lines


# --- Sending to another process (see `_sending`) and a DataLoader worker's collate (see
# `_worker_collate`): the same rules and the same words as a copy's, with "send" for "copy".

_SENT_ITSELF = "<the object sent itself>"


def send_detached_warning(root: Any, setting: ModeSetting, entries: Sequence[Entry]) -> str:
    """Mode warn: the send of `root` to another process is complete and detached `entries`."""
    return "\n".join([
        f"deepcopy_shim: sending {a_name_of(root)} to another process detached "
        f"{_tensors(len(entries))} with autograd history:",
        *_listing(entries, "all are in the warning's .paths", _SENT_ITSELF),
        _fill(
            "Each arrives as a leaf with the same values and requires_grad, without the graph, "
            "in memory of its own: a copy, not shared with this process. "
            f"Mode 'warn' is set by {setting.spelled()}: {setting.spelled('silent')} sends "
            f"without this warning, {setting.spelled('strict')} refuses such sends; or detach "
            "these tensors before sending."
        ),
    ])


def send_refusal(root: Any, setting: ModeSetting, entries: Sequence[Entry],
                 incomplete: Optional[str], torch_words: str) -> str:
    """Mode strict: the send of `root` to another process would meet `entries`, so it is
    refused.  `incomplete`: what stopped the survey of the send, if anything did; `torch_words`:
    torch's own refusal, kept whole on the last line (code may look for its words)."""
    how = _ways_out(entries)
    lines = [
        f"deepcopy_shim: refused to send {a_name_of(root)} holding {_tensors(len(entries))} with "
        "autograd history to another process:",
        *_listing(entries, "all are in the error's .paths", _SENT_ITSELF),
    ]
    if incomplete is not None:
        lines.append(_fill(
            f"The list may be incomplete: the rest of the send could not be followed ({incomplete})."
        ))
    lines += [
        _fill(
            f"Mode 'strict' is set by {setting.spelled()}. Nothing was sent; nothing in the source "
            f"was detached. {setting.spelled('warn')} or {setting.spelled('silent')} sends these "
            "tensors as detached leaves (copies, not shared memory); or detach or drop them "
            "before sending" + (", e.g. (obj is the object sent):" if how else ".")
        ),
        *how,
        "torch's refusal: " + " ".join(torch_words.split()),
    ]
    return "\n".join(lines)


def collate_detached_warning(setting: ModeSetting, entries: Sequence[Entry], requires_grad: bool) -> str:
    """Mode warn: a DataLoader worker's default collate stacked the detached copies of the
    samples' tensors `entries` (paths: `[i]`, the sample's place in the batch)."""
    return "\n".join([
        f"deepcopy_shim: a DataLoader worker's default collate detached {_tensors(len(entries))} "
        "with autograd history (one per sample, by its place in the batch):",
        *_listing(entries, "all are in the warning's .paths"),
        _fill(
            "The batch is stacked from their detached copies: a leaf with the same values "
            f"(requires_grad={requires_grad}, as stacking them gives), without the graph, which "
            f"cannot leave the worker. Mode 'warn' is set by {setting.spelled()}: "
            f"{setting.spelled('silent')} collates without this warning, "
            f"{setting.spelled('strict')} refuses such batches; or detach the samples in the "
            "dataset."
        ),
    ])


def collate_refusal(setting: ModeSetting, entries: Sequence[Entry], torch_words: str) -> str:
    """Mode strict: a DataLoader worker's default collate met the samples' tensors with history
    `entries`, so it refuses the batch; `torch_words`: torch's own error, kept whole."""
    return "\n".join([
        f"deepcopy_shim: refused to collate {_tensors(len(entries))} with autograd history in a "
        "DataLoader worker (one per sample, by its place in the batch):",
        *_listing(entries, "all are in the error's .paths"),
        _fill(
            f"Mode 'strict' is set by {setting.spelled()}. Nothing was collated; nothing in the "
            f"samples was detached. {setting.spelled('warn')} or {setting.spelled('silent')} "
            "stacks their detached copies into a leaf batch (the graph cannot leave the worker "
            "either way); or detach the samples in the dataset."
        ),
        "torch's refusal: " + " ".join(torch_words.split()),
    ])
