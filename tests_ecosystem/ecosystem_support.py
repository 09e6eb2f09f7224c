"""Helpers for the ecosystem suite (fixtures live in conftest.py; test modules import this one).

The central helper is :func:`assert_reports`: it runs one copy scenario natively and in each of
the shim's three modes, and checks every mode's report against the contract:

* native: ``copy.deepcopy`` (or the library call that makes it) raises torch's graph-leaves error
  exactly when the scenario expects paths;
* an independent oracle, :func:`native_met`, which records every non-leaf tensor that *native*
  deepcopy meets (torch's ``Tensor.__deepcopy__`` replaced by a recorder for one call), confirms
  that the expected paths name exactly those tensors, in that order, by identity: the expected
  tuple in a test is checked against the real objects, not only against the shim;
* ``warn``: one ``DetachedTensorsWarning`` per top-level copy, ``.paths`` equal to the expected
  tuple, pointing at the test file (the line of the copy call) even when a library made the copy;
* ``strict``: ``NonLeafTensorError`` with the same ``.paths`` and the source tensors in
  ``.tensors`` iff paths are expected; otherwise the call returns as it does natively;
* ``silent``: no word;
* ``find_nonleaf_tensors(root)`` lists the same paths (the property of ``test_report_consistency``);
* every spellable path resolves, with ``eval("obj" + sep + path)``, to the very source tensor, and
  in the copy to a detached leaf twin with the same values.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import torch

import deepcopy_shim

MODES = ("warn", "strict", "silent")
GRAPH_LEAVES = "graph leaves"

# torch exactly as it is without the shim; conftest checks, before and after every test, that
# the shim is off and these are in place.  Taken at import: conftest refuses to run when the
# shim was activated at start-up (DEEPCOPY_SHIM), so this is torch's own state.
ORIGINAL_TENSOR_DEEPCOPY = vars(torch.Tensor)["__deepcopy__"]


def _owned_by_shim(value: Any) -> bool:
    for candidate in (value, type(value)):
        module = getattr(candidate, "__module__", None)
        if isinstance(module, str) and module.split(".")[0] == "deepcopy_shim":
            return True
    return False


def shim_state_problems() -> List[str]:
    """What differs from "shim off, torch untouched by it" (empty when all is as it should be).

    ``torch.Tensor.__deepcopy__`` must be torch's own function, ``torch.nn.Module`` must have no
    ``__deepcopy__`` and no attribute of the shim's.  Other libraries patch ``nn.Module`` too
    (dynamo wraps ``__init__`` and ``__setstate__`` on its first compile, transformers adds
    ``smart_apply``): those are theirs and not counted.
    """
    problems = []
    if deepcopy_shim.is_enabled():
        problems.append(f"deepcopy_shim is enabled ({deepcopy_shim.current_mode()})")
    if vars(torch.Tensor)["__deepcopy__"] is not ORIGINAL_TENSOR_DEEPCOPY:
        problems.append(f"torch.Tensor.__deepcopy__ is {vars(torch.Tensor)['__deepcopy__']!r}")
    attrs = vars(torch.nn.Module)
    if "__deepcopy__" in attrs:
        problems.append(f"torch.nn.Module.__deepcopy__ is {attrs['__deepcopy__']!r}")
    owned = sorted(k for k, v in attrs.items() if _owned_by_shim(v))
    if owned:
        problems.append(f"torch.nn.Module attributes of deepcopy_shim's: {owned}")
    return problems


# --- native behaviour -------------------------------------------------------------------------

def is_graph_leaves_error(exc: BaseException) -> bool:
    """torch's own refusal (not the shim's NonLeafTensorError, which is also a RuntimeError)."""
    return (isinstance(exc, RuntimeError) and not isinstance(exc, deepcopy_shim.NonLeafTensorError)
            and GRAPH_LEAVES in str(exc))


def _require_native() -> None:
    problems = shim_state_problems()
    assert not problems, f"native run requested while the shim is active: {problems}"


def native_outcome(fn: Callable[[], Any]) -> Tuple[str, Any]:
    """Run ``fn()`` with the shim off: ``("ok", result)`` or ``("graph-leaves", exc)``.

    Any other exception propagates.  Library warnings raised on the way are not shown.
    """
    _require_native()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", fn()
        except RuntimeError as exc:
            if is_graph_leaves_error(exc):
                return "graph-leaves", exc
            raise


def native_met(fn: Callable[[], Any]) -> Tuple[Any, List[torch.Tensor]]:
    """Run ``fn()`` natively, with torch's ``Tensor.__deepcopy__`` replaced by a recorder.

    Returns ``(result, met)``: ``met`` lists, in order, the non-leaf tensors that native deepcopy
    met during the call, i.e. the tensors at which torch would have raised (the recorder copies
    each as ``detach().clone()`` instead, so the call runs to its end), each once per top-level
    copy, at its first meeting: one copy names a tensor once, however many times it meets it
    (a ``__deepcopy__`` that copies an attribute with a fresh memo meets it again).  A top-level
    copy is the outermost ``copy.deepcopy`` call on the stack, however it was reached.  This is
    the oracle the scenarios' expected paths are checked against; it knows nothing of the shim.
    """
    _require_native()
    met: List[torch.Tensor] = []
    # (id of the outermost deepcopy frame, id of the tensor) for each first meeting; the frames
    # are kept until the call ends, so that no later top-level copy's frame gets an id reused.
    seen: Set[Tuple[int, int]] = set()
    frames: List[Any] = []
    original = ORIGINAL_TENSOR_DEEPCOPY
    deepcopy_code = copy.deepcopy.__code__

    def top_level_copy() -> Any:
        outermost, frame = None, sys._getframe(2)
        while frame is not None:
            if frame.f_code is deepcopy_code:
                outermost = frame
            frame = frame.f_back
        return outermost

    def recorder(self: torch.Tensor, memo: Dict[int, Any]) -> torch.Tensor:
        if not self.is_leaf:  # torch checks this before its memo, so every call is a meeting
            outermost = top_level_copy()
            if (id(outermost), id(self)) not in seen:
                seen.add((id(outermost), id(self)))
                frames.append(outermost)
                met.append(self)
            if id(self) in memo:
                return memo[id(self)]
            with torch.no_grad():
                new = self.detach().clone()
            if self.requires_grad:
                new.requires_grad_(True)
            memo[id(self)] = new
            return new
        return original(self, memo)

    torch.Tensor.__deepcopy__ = recorder  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fn()
    finally:
        torch.Tensor.__deepcopy__ = original  # type: ignore[method-assign]
    return result, met


# --- paths ------------------------------------------------------------------------------------

def split_path(path: str) -> Tuple[str, Optional[str]]:
    """``("head.cache", None)`` for a spellable path; ``("state", "why...")`` for
    ``"state <why...>"`` (the part no Python access reaches, and why).

    The reason starts at the first `` <`` (or a leading ``<``) outside brackets and string
    literals, so keys such as ``['a <b>']`` are not mistaken for one.
    """
    depth, quote, escaped = 0, None, False
    for i, ch in enumerate(path):
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "<" and depth == 0 and (i == 0 or path[i - 1] == " "):
            assert path.endswith(">"), f"malformed path {path!r}"
            return path[: max(i - 1, 0)], path[i + 1:-1]
    return path, None


def spellable(path: str) -> bool:
    return split_path(path)[1] is None


def resolve(root: Any, path: str) -> Any:
    """The object ``path`` names under ``root``: ``eval("obj" + sep + path, {"obj": root})``."""
    spelled, why = split_path(path)
    if why is not None:
        raise ValueError(f"{path!r} is not spellable ({why})")
    if spelled == "":
        return root
    return eval("obj" + ("" if spelled.startswith("[") else ".") + spelled, {"obj": root})


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def assert_stable_path(path: str) -> None:
    """A path never contains a memory address (it must read the same on every run)."""
    assert not _ADDRESS.search(path), f"path {path!r} contains a memory address"


# --- the three modes against native --------------------------------------------------------------

@dataclass
class Reports:
    """What :func:`assert_reports` saw, for the scenario's own further checks."""

    native: Tuple[str, Any]
    met: List[torch.Tensor]
    objects: Dict[str, Any] = field(default_factory=dict)
    """mode -> the object the mode's copy call was given."""
    results: Dict[str, Any] = field(default_factory=dict)
    """mode -> what the copy call returned (strict only when it did not raise)."""
    warnings: List[Any] = field(default_factory=list)
    """the warn mode's DetachedTensorsWarning records."""
    error: Optional[deepcopy_shim.NonLeafTensorError] = None
    """the strict mode's refusal, if any."""
    found: Optional[List[Tuple[str, torch.Tensor]]] = None
    """find_nonleaf_tensors(root) of a fresh object, when checked."""


def _call_site(copy_call: Callable[..., Any]) -> Tuple[str, set]:
    code = getattr(copy_call, "__code__", None)
    if code is None:
        raise TypeError("copy_call must be a function defined in the test module (a lambda), so that "
                        "the shim's warning can be checked to point at it")
    filename = code.co_filename
    if not os.path.basename(filename).startswith("test_"):
        raise TypeError(f"copy_call is defined in {filename}, not in a test module")
    lines = {line for _, _, line in code.co_lines() if line is not None}
    return filename, lines


def _sources(root: Any, paths: Sequence[str]) -> Dict[str, Any]:
    """The objects the spellable ``paths`` name under ``root``, taken before the copy call: a
    library may change the source while it copies (Lightning trains it after ``setup``)."""
    return {path: resolve(root, path) for path in paths if spellable(path)}


def _same_paths(reported: Sequence[str], expected: Sequence[str]) -> None:
    reported, expected = tuple(reported), tuple(expected)
    assert reported == expected, f"paths {reported} != expected {expected}"


def assert_reports(
    make_obj: Callable[[], Any],
    copy_call: Callable[[Any], Any],
    expected_paths: Union[Sequence[str], Callable[[Any], Sequence[str]]],
    *,
    root: Callable[[Any], Any] = lambda obj: obj,
    copied_root: Optional[Callable[[Any, Any], Any]] = None,
    copies: int = 1,
    fresh: bool = True,
    scan: Union[bool, Sequence[str]] = True,
) -> Reports:
    """Check one scenario natively and in every mode (see the module docstring).

    Args:
        make_obj: builds the object handed to ``copy_call``.
        copy_call: ``obj -> result``, a lambda defined in the test module: it (or the library it
            calls) makes the deep copy.  The warning must point at it.
        expected_paths: the paths one top-level copy reports, in order (``()``: none); or
            ``obj -> those paths``, computed from each object built (hook ids, for instance,
            come from a global counter and differ between builds).
        root: ``obj -> the object deep-copied`` (the paths' root), when it is not ``obj`` itself
            (peft copies ``model.transformer.ln_f``).
        copied_root: ``(obj, result) -> the copy of root``; when given, every spellable path is
            also followed in the copy, which must hold a detached leaf twin there.
        copies: how many top-level copies of ``root`` the call makes (``nn.TransformerEncoder``
            copies its layer once per layer), each reporting ``expected_paths``.
        fresh: build a new object per run (a copy call with side effects); else build one.
        scan: check ``find_nonleaf_tensors(root)`` against ``expected_paths`` (``True``), against
            the given paths (a call that does not deep-copy ``root`` plainly, e.g. with a custom
            memo), or not at all (``False``).
    """
    filename, lines = _call_site(copy_call)
    shared = None if fresh else make_obj()

    def build() -> Any:
        return make_obj() if fresh else shared

    def paths_for(obj: Any) -> Tuple[str, ...]:
        paths = tuple(expected_paths(obj) if callable(expected_paths) else expected_paths)
        for path in paths:
            assert_stable_path(path)
        return paths

    # Native: the graph-leaves error exactly when there is something to report.
    obj = build()
    expected = paths_for(obj)
    native = native_outcome(lambda: copy_call(obj))
    assert native[0] == ("graph-leaves" if expected else "ok"), (
        f"native outcome {native[0]!r} (expected paths: {expected})")

    # The oracle: the expected paths name exactly the tensors native deepcopy meets.
    obj = build()
    expected = paths_for(obj)
    sources = _sources(root(obj), expected)
    _, met = native_met(lambda: copy_call(obj))
    assert len(met) == len(expected) * copies, (
        f"native deepcopy met {len(met)} non-leaf tensors, the scenario expects "
        f"{len(expected)} x {copies}: {expected}")
    for index, path in enumerate(expected * copies):
        if spellable(path):
            assert sources[path] is met[index], f"{path!r} is not the tensor met #{index}"

    reports = Reports(native=native, met=met)
    for mode in MODES:
        obj = build()
        expected = paths_for(obj)
        src_root = root(obj)
        sources = _sources(src_root, expected)
        reports.objects[mode] = obj
        error: Optional[BaseException] = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with deepcopy_shim.enabled(mode):
                try:
                    reports.results[mode] = copy_call(obj)
                except Exception as exc:  # checked below
                    error = exc
        shim_warnings = [w for w in caught if issubclass(w.category, deepcopy_shim.DeepcopyShimWarning)]

        if mode == "strict" and expected:
            assert isinstance(error, deepcopy_shim.NonLeafTensorError), f"strict did not refuse: {error!r}"
            assert isinstance(error, RuntimeError)
            _same_paths(error.paths, expected)
            assert len(error.tensors) == len(expected)
            for want, tensor in zip(expected, error.tensors):
                assert isinstance(tensor, torch.Tensor) and not tensor.is_leaf
                if spellable(want):
                    assert sources[want] is tensor, f"strict: {want!r} does not name its tensor"
            assert shim_warnings == [], [str(w.message) for w in shim_warnings]
            reports.error = error
            continue
        if error is not None:
            raise AssertionError(f"mode {mode}: the copy call raised {error!r}") from error

        if mode == "warn" and expected:
            assert [w.category for w in shim_warnings] == [deepcopy_shim.DetachedTensorsWarning] * copies, (
                [(w.category.__name__, str(w.message)) for w in shim_warnings])
            for w in shim_warnings:
                _same_paths(w.message.paths, expected)
                where = f"the warning points at {w.filename}:{w.lineno}"
                assert w.filename == filename, f"{where}, not at {filename}"
                assert w.lineno in lines, f"{where}, not at the copy call (lines {sorted(lines)})"
                assert str(w.message).startswith("deepcopy_shim")
            reports.warnings = shim_warnings
        else:
            assert shim_warnings == [], (mode, [str(w.message) for w in shim_warnings])

        if copied_root is not None:
            dst_root = copied_root(obj, reports.results[mode])
            for path, source in sources.items():
                assert_detached_twin(source, resolve(dst_root, path))

    if scan is not False:
        obj = make_obj()
        expected = paths_for(obj)
        scan_expected = expected if scan is True else tuple(scan)
        sources = _sources(root(obj), scan_expected)
        found = deepcopy_shim.find_nonleaf_tensors(root(obj))
        _same_paths([p for p, _ in found], scan_expected)
        for (_, tensor), want in zip(found, scan_expected):
            if spellable(want):
                assert sources[want] is tensor, f"find_nonleaf_tensors: {want!r} does not name its tensor"
        if scan is True and not callable(expected_paths):
            # The property: the scan, strict and warn name the same paths.  (With paths computed
            # per object each was compared with its own object's expected paths above.)
            names = {p for p, _ in found}
            if reports.error is not None:
                assert names == set(reports.error.paths)
            for w in reports.warnings:
                assert names == set(w.message.paths)
        reports.found = found
    return reports


# --- the copy itself ----------------------------------------------------------------------------

def assert_detached_twin(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst`` is the shim's copy of the non-leaf ``src``: a leaf with the same values, dtype,
    shape and requires_grad, in storage of its own."""
    assert isinstance(dst, torch.Tensor) and dst is not src
    assert dst.is_leaf and dst.grad_fn is None
    assert dst.requires_grad == src.requires_grad
    assert dst.dtype == src.dtype and dst.shape == src.shape
    assert torch.equal(dst.detach(), src.detach())
    if src.numel():
        assert dst.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()


def _tensor_of(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for item in out:
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                return item
    raise TypeError(f"cannot find an output tensor in {type(out).__name__}")


def _storages(module: Any) -> Dict[int, str]:
    found = {}
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if tensor.numel():
            found[tensor.untyped_storage().data_ptr()] = name
    return found


def assert_independent_copy(
    src: Any,
    dst: Any,
    run_inputs: Union[Callable[[Any], Any], Tuple[Any, ...]],
    *,
    same_outputs: bool = True,
    step: bool = True,
) -> None:
    """``dst`` is an independent copy of the module ``src``.

    * ``same_outputs``: the same output on the same inputs (run under the same RNG seed, so that
      dropout draws the same masks);
    * no parameter or buffer storage shared with ``src``;
    * ``step``: one SGD step on the copy changes the copy and leaves ``src``'s parameters and
      gradients exactly as they were (no gradient flows into the source's graph).

    ``run_inputs`` is ``model -> output`` or a tuple of positional inputs; the output is a tensor,
    a ``ModelOutput`` (its logits) or a tuple (its first floating-point tensor).
    """
    run = run_inputs if callable(run_inputs) else (lambda m: m(*run_inputs))
    assert dst is not src
    if same_outputs:
        outputs = []
        for model in (src, dst):
            with torch.random.fork_rng():
                torch.manual_seed(1234)
                outputs.append(_tensor_of(run(model)).detach())
        torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    shared = set(_storages(src)) & set(_storages(dst))
    assert not shared, f"the copy shares storage with the source: {sorted(_storages(dst)[p] for p in shared)}"
    if not step:
        return
    src_params = dict(src.named_parameters())
    before = {n: p.detach().clone() for n, p in src_params.items()}
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in src_params.items()}
    trainable = [p for p in dst.parameters() if p.requires_grad]
    if not trainable:  # a frozen copy (trl's reference model): unfreeze the copy for the check
        trainable = [p for p in dst.parameters() if p.is_floating_point()]
        for p in trainable:
            p.requires_grad_(True)
    assert trainable, "the copy has no parameters to train"
    dst_before = [p.detach().clone() for p in trainable]
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    optimizer.zero_grad()
    loss = _tensor_of(run(dst)).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    changed = [not torch.equal(p.detach(), b) for p, b in zip(trainable, dst_before)]
    assert any(changed), "the step changed nothing"
    for name, param in src_params.items():
        assert torch.equal(param.detach(), before[name]), f"training the copy changed the source's {name}"
        if grads[name] is None:
            assert param.grad is None, f"training the copy gave the source's {name} a gradient"
        else:
            assert torch.equal(param.grad, grads[name]), f"training the copy changed the source's {name}.grad"


# --- timm without torchvision -------------------------------------------------------------------

def load_timm_model_ema() -> types.ModuleType:
    """``timm/utils/model_ema.py`` loaded by file path (it needs only torch), without importing
    the ``timm`` package, which requires torchvision.  The module lives in site-packages, so for
    the shim it is library code like any other."""
    spec = importlib.util.find_spec("timm")
    if spec is None or spec.origin is None:
        raise ImportError("timm is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "utils", "model_ema.py")
    loaded = importlib.util.spec_from_file_location("_timm_model_ema_standalone", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


class _StubMeta(type):
    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"


class _StubModule(types.ModuleType):
    __path__: ClassVar[List[str]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (torch.nn.Module,), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any,
                  target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def stubbed_torchvision() -> Iterator[bool]:
    """Within the block, ``import torchvision`` (and every submodule) gives a stand-in whose
    attributes are dummy ``nn.Module`` classes: enough for ``import timm`` and
    ``timm.create_model(..., pretrained=False)`` of plain models.  Yields False (and changes
    nothing) when a real torchvision imports.  On exit the stand-in is removed from
    ``sys.meta_path`` and ``sys.modules``, so that nothing else in the session can see it."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        pass
    else:
        yield False
        return
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield True
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]


def assert_like_native(copied: Any, native: Any) -> None:
    """``copied`` is what native deepcopy returned (``native``), up to identity: the same type,
    the same instance attributes, and for modules the same ``state_dict`` (names and values)."""
    assert type(copied) is type(native), f"{type(copied).__name__} != native {type(native).__name__}"
    if hasattr(native, "__dict__"):
        assert sorted(vars(copied)) == sorted(vars(native))
    if isinstance(native, torch.nn.Module):
        ours, theirs = copied.state_dict(), native.state_dict()
        assert list(ours) == list(theirs)
        for key in theirs:
            assert torch.equal(ours[key], theirs[key]), key


class CopiesUnreachable:
    """A custom ``__deepcopy__`` that copies a tensor no attribute leads to (held in a closure;
    deepcopy treats functions as atoms)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.get = lambda: tensor

    def __deepcopy__(self, memo: Dict[int, Any]) -> CopiesUnreachable:
        new = CopiesUnreachable.__new__(CopiesUnreachable)
        copied = copy.deepcopy(self.get(), memo)
        new.get = lambda: copied
        return new
