"""Copying one tensor: torch's own `Tensor.__deepcopy__` first, the detached copy when it refuses."""

from __future__ import annotations

import copyreg
import functools
import os
import sys
from types import MethodType
from typing import Any, Callable, ContextManager, Dict, Optional, Tuple

import torch
import wrapt

from . import _modes, _record, _refusal, _report
from ._access import existing_instance_dict
from ._errors import DetachedCopyError
from ._modes import Mode
from ._protocol import NIL, keep_alive

__all__ = [
    "REFUSAL",
    "StableFunctionWrapper",
    "stable_function_wrapper",
    "tensor_patch",
    "copy_detached",
    "make_tensor_deepcopy_wrapper",
    "neutral_torch",
    "refusal_problem",
]

# pytest leaves this module's frames out of the tracebacks it shows: a strict refusal is
# raised here, inside the tensor's __deepcopy__, and should read as the user's copy failing.
__tracebackhide__ = True

_current_setting = _modes.current_setting
_surveying = _record.surveying
# What torch's refusal says, in every release from 2.0 on (older ones say less after it).
REFUSAL = "graph leaves"


class StableFunctionWrapper(wrapt.FunctionWrapper):  # type: ignore[type-arg]
    """A `wrapt.FunctionWrapper` whose class attribute access returns the wrapper itself, and
    whose instance access binds `bound`, a plain function of the wrapped one's signature.

    wrapt binds a fresh `BoundFunctionWrapper` on every `Tensor.__deepcopy__` access; torch
    compares `func is Tensor.__deepcopy__` (FakeTensor's `__torch_function__`), and
    `handle_torch_function` hands that attribute to every `__torch_function__`, so it must
    keep one identity.  As a wrapt proxy it also hashes and compares equal to the original, so
    torch's cached sets of Tensor methods (`torch.overrides`) still recognise it.

    Instance access, what deepcopy makes for every tensor, binds `bound` with a plain
    `MethodType`, without wrapt's calling convention.  Where no mode applies (see `_modes`),
    and no survey runs (see `_survey`), it binds the wrapped function itself: `t.__deepcopy__`
    is then what it is without the shim, for deepcopy and for anyone who looks.  Made by
    `stable_function_wrapper`, as a class of its own per wrapper: its `__get__` reads the two
    functions from its closure (an attribute of a wrapt proxy costs a quarter of a microsecond
    to read, on every tensor a copy meets).
    """

    _self_bound: Callable[..., Any]  # the function instances bind where a mode applies


def tensor_patch(original: Callable[..., Any],
                 hold: Callable[[], ContextManager[Any]]) -> StableFunctionWrapper:
    """The patch of `Tensor.__deepcopy__` around torch's `original` (see
    `make_tensor_deepcopy_wrapper`), made once per function and process: its class is made with
    it, and a class lives in a reference cycle of its own, which a patch made at every install
    would leave to the garbage collector at every `deepcopy_shim.deepcopy()` call."""
    known = _patches.get(id(original))
    if known is None or known[0] is not original or known[1] is not hold:
        known = _patches[id(original)] = (
            original, hold, stable_function_wrapper(original, *make_tensor_deepcopy_wrapper(original, hold)))
    return known[2]


# id(torch's function) -> (that function, hold, its patch): see tensor_patch.
_patches: Dict[int, Tuple[Callable[..., Any], Callable[[], ContextManager[Any]], StableFunctionWrapper]] = {}


def stable_function_wrapper(wrapped: Callable[..., Any], wrapper: Callable[..., Any],
                            bound: Callable[..., Any]) -> StableFunctionWrapper:
    """A `StableFunctionWrapper` of `wrapped` (with wrapt's `wrapper`, for calls through the
    class) whose instances bind `bound`."""
    current_setting, surveying, running = _current_setting, _surveying, _record.current

    class Bound(StableFunctionWrapper):
        def __get__(self, instance: Any, owner: Any = None) -> Any:
            if instance is None:
                return self
            copy_ = running()
            if copy_ is not None and copy_.open:
                return MethodType(bound, instance)  # in a copy the shim runs: asked first
            if current_setting() is None and not surveying():
                return MethodType(wrapped, instance)
            return MethodType(bound, instance)

    Bound.__name__ = Bound.__qualname__ = StableFunctionWrapper.__name__
    made = Bound(wrapped, wrapper)
    made._self_bound = bound
    return made


class neutral_torch:
    """torch as a fresh process runs it, whatever the caller set: grad mode on, inference mode
    off, no torch function or dispatch mode (`set_default_device`, `FakeTensorMode`, a
    user's mode).  For the shim's own probes, which must give the same
    answer under `torch.no_grad()` as anywhere else."""

    def __enter__(self) -> None:
        self._stack = []
        for guard in _NEUTRAL:
            manager = guard()
            manager.__enter__()
            self._stack.append(manager)

    def __exit__(self, *exc: Any) -> None:
        while self._stack:
            self._stack.pop().__exit__(*exc)


def _disable_dispatch_modes() -> ContextManager[Any]:
    from torch.utils import _python_dispatch

    return _python_dispatch._disable_current_modes()


_NEUTRAL: Tuple[Callable[[], Any], ...] = (
    torch.enable_grad,
    lambda: torch.inference_mode(False),
    torch._C.DisableTorchFunction,
    _disable_dispatch_modes,
)
# The answer of refusal_problem() for the Tensor.__deepcopy__ it was asked about.
_checked: Dict[int, Tuple[Callable[..., Any], Optional[str]]] = {}


def refusal_problem(original: Callable[..., Any]) -> Optional[str]:
    """None if `original` refuses a non-leaf tensor the way the shim expects, else why not.

    The shim handles exactly one error of torch's; if this torch copies non-leaf tensors itself,
    or refuses them in words the shim does not recognise, the patch must stay out of the way.
    The probe runs in `neutral_torch()`, so the answer is the same in every grad mode,
    inference mode and torch mode the caller may be in; it is worked out once per function.
    """
    known = _checked.get(id(original))
    if known is not None and known[0] is original:
        return known[1]
    with neutral_torch():
        problem = _probe(original)
    _checked[id(original)] = (original, problem)
    return problem


def _probe(original: Callable[..., Any]) -> Optional[str]:
    probe = torch.ones(1, requires_grad=True, dtype=torch.float32, device="cpu") * 2
    try:
        original(probe, {})
    except RuntimeError as exc:
        if _is_torch_refusal(exc, original):  # the very test every copy applies
            return None
        if type(exc) is RuntimeError and REFUSAL in str(exc):
            # torch's words, raised below another function: someone wraps torch's own.
            return (f"deepcopy_shim: torch.Tensor.__deepcopy__ is not torch's own function but "
                    f"{_code_name(original)}, which wraps it (another library's or your own "
                    "patch); the shim stays out of the way (copies behave natively). Remove that "
                    "patch, or enable deepcopy_shim before it is applied.")
        return (f"deepcopy_shim: torch {torch.__version__} refuses to deep-copy a non-leaf tensor "
                f"with a message deepcopy_shim does not recognise ({exc}); the shim stays out of "
                "the way (copies behave natively). Please report this with the output of "
                "`python -m deepcopy_shim --check`.")
    except Exception as exc:
        return (f"deepcopy_shim: torch {torch.__version__} failed in an unexpected way when "
                f"deep-copying a non-leaf tensor ({type(exc).__name__}: {exc}); the shim stays "
                "out of the way (copies behave natively).")
    return (f"deepcopy_shim: torch {torch.__version__} deep-copies non-leaf tensors itself; the "
            "shim is not needed and stays out of the way (copies behave natively).")


def _code_name(function: Any) -> str:
    """`name (file:line)` of a function's code: what it is, whatever name it was given."""
    code = getattr(function, "__code__", None)
    if code is None:
        return repr(function)
    name = getattr(code, "co_qualname", code.co_name)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


def make_tensor_deepcopy_wrapper(original: Callable[..., Any],
                                 hold: Callable[[], ContextManager[Any]]
                                 ) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """Return the two callables of the patch around `original`: the wrapt wrapper function
    (what a call through the class runs: `Tensor.__deepcopy__(t, memo)`, torch's redispatch
    from `__torch_function__`) and the plain function of torch's own signature, `(self, memo)`,
    that an instance binds (`t.__deepcopy__(memo)`, what deepcopy calls for every tensor).

    Both do the same: in a copy the shim runs (see `_record`), delegate to `original` and only
    handle torch's "graph leaves" refusal; called directly where a mode applies and no copy
    runs, start a copy of their own for this tensor.  `hold()` keeps the patch installed while
    a strict refusal is surveyed after its copy.
    """
    current_copy = _record.current_copy
    # Delegate first.  Inspecting the tensor before delegating (is_leaf, has_torch_function)
    # recurses forever on the __torch_function__ redispatch path; delegating first lets torch
    # do everything it can (leaves, memo hits, subclasses, sparse, quantized) exactly as it
    # always does.  No name in these frames holds an exception: each is in a traceback that
    # holds the frame, a cycle that would keep the copy made so far alive until the garbage
    # collector ran (native deepcopy frees it as soon as the error is handled).

    def tensor_deepcopy(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                        kwargs: Dict[str, Any]) -> Any:
        copy_ = current_copy()
        if copy_ is None and _current_setting() is not None:
            try:
                tensor, memo = _bind(args, kwargs)
            except (IndexError, KeyError):  # not torch's two arguments: torch says what is wrong
                return wrapped(*args, **kwargs)
            return _copy_alone(original, hold, tensor, memo, sys._getframe(1))
        if copy_ is not None and copy_.survey is not None:
            tensor, memo = _bind(args, kwargs)
            return copy_.survey.copy_tensor(tensor, memo, sys._getframe(1), copy_)
        try:
            return wrapped(*args, **kwargs)
        except RuntimeError:
            # torch got its two arguments (a bad call raises TypeError): they bind.
            tensor, memo = _bind(args, kwargs)
            copied = _after_refusal(original, hold, tensor, memo, sys._getframe(1), copy_)
            if copied is NIL:
                raise
            return copied

    current = _record.current

    def bound_deepcopy(self: torch.Tensor, memo: Dict[Any, Any]) -> Any:
        # current_copy(), written out: this runs for every tensor a copy meets.
        copy_ = current()
        if copy_ is not None and not copy_.open:
            copy_ = None
        if copy_ is None:
            if _current_setting() is None:  # (a scope without the shim, entered in a survey)
                return original(self, memo)
            return _copy_alone(original, hold, self, memo, sys._getframe(1))
        if copy_.survey is not None:
            return copy_.survey.copy_tensor(self, memo, sys._getframe(1), copy_)
        try:
            return original(self, memo)
        except RuntimeError:
            copied = _after_refusal(original, hold, self, memo, sys._getframe(1), copy_)
            if copied is NIL:
                raise
            return copied

    # Named and documented as torch's (as the wrapt proxy reports itself), unwrapping to it.
    functools.update_wrapper(bound_deepcopy, original)
    return tensor_deepcopy, bound_deepcopy


def _copy_alone(original: Callable[..., Any], hold: Callable[[], ContextManager[Any]],
                tensor: torch.Tensor, memo: Dict[Any, Any], caller: Any) -> Any:
    """Copy `tensor`, whose `__deepcopy__` was called directly where a mode applies and no copy
    runs (by code of its own, or by a deepcopy that is not the standard library's): the
    tensor's copy is a top-level copy of its own, started and ended here."""
    setting = _current_setting()
    assert setting is not None  # the callers asked
    copy_ = _record.Copy(tensor, memo, setting, sys._getframe(0))
    with hold(), _record.opened(copy_):
        try:
            copied = original(tensor, memo)
        except RuntimeError:
            copied = _after_refusal(original, hold, tensor, memo, caller, copy_)
            if copied is NIL:
                raise
    copy_.report()
    return copied


def _after_refusal(original: Callable[..., Any], hold: Callable[[], ContextManager[Any]],
                   tensor: torch.Tensor, memo: Dict[Any, Any], caller: Any,
                   copy_: Optional[_record.Copy]) -> Any:
    """What the copy of `tensor` (called by the frame `caller`, in `copy_`) is, the
    RuntimeError of `original` being handled: NIL where that error stands (no mode applies,
    it is not torch's refusal, or the tensor is a leaf: the refusal came from somewhere inside
    it), the memo's copy where it has one, else the detached copy; in mode strict, raises
    `NonLeafTensorError` with torch's error as its cause.  The mode is the copy's own, the one
    it started in, whatever scope was left or global setting changed since."""
    setting = copy_.setting if copy_ is not None else None
    error: Any = sys.exc_info()[1]
    if setting is None or copy_ is None or not _is_torch_refusal(error, original) or tensor.is_leaf:
        return NIL  # (no copy runs only where no mode applies: see the callers)
    if setting.mode is Mode.STRICT:
        # torch checks is_leaf before its memo, so it refuses even a tensor the memo already
        # holds (a retained .grad, copied by a direct __deepcopy__ call): so does strict.
        # refuse() makes torch's error (the one being handled) the cause.  The raise below is
        # the last source line a plain Python traceback shows: it says what happened.
        refused_in_mode_strict = _refusal.refuse(tensor, caller, setting, error, hold, copy_)
        try:
            raise refused_in_mode_strict  # deepcopy_shim mode strict: the message below says what and how
        finally:
            del refused_in_mode_strict  # the traceback holds this frame: no cycle through the error
    # A tensor already copied in this deepcopy (reached again through a direct __deepcopy__
    # call) is a memo hit in the detaching modes: its detached copy, shared.
    existing = memo.get(id(tensor), NIL)
    if existing is not NIL:
        return existing
    return copy_detached(original, tensor, memo, setting, caller, copy_)


def _is_torch_refusal(exc: Any, original: Callable[..., Any]) -> bool:
    """True for torch's own refusal: a plain RuntimeError in torch's words, raised by torch's
    `Tensor.__deepcopy__` (`original`) itself.  Anything else passes through unchanged: the
    shim's own errors on a subclass's `__torch_function__` path, a subclass's errors (even in
    torch's words), a failure deeper in torch."""
    if type(exc) is not RuntimeError or REFUSAL not in str(exc):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is getattr(original, "__code__", None)


def _bind(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Any]:
    # torch's signature is (self, memo), each positional or by keyword: called on a tensor,
    # the tensor comes first (StableFunctionWrapper binds with a MethodType); called through
    # the class, `self=` may name it.
    bound = (*args, *(kwargs[name] for name in ("self", "memo")[len(args):]))
    return bound[0], bound[1]


def copy_detached(original: Callable[..., Any], tensor: torch.Tensor, memo: Dict[Any, Any],
                  setting: _modes.ModeSetting, caller: Any, copy_: _record.Copy) -> torch.Tensor:
    """Copy the non-leaf `tensor` exactly as torch copies its detached alias, in `copy_`.

    The alias is `tensor.detach()` (of `tensor`'s class), given `tensor`'s instance dict (a
    shallow copy), its slots and its retained `.grad`: torch's own function then copies it with
    `memo` as it copies any leaf, so the copy is what `copy.deepcopy(tensor.detach(), memo)`
    makes: the storage copied once per copy through torch's storage memo and shared by every
    tensor of that storage in the copy, strides and storage offset kept, conj and neg bits
    resolved as torch resolves them on a leaf, sparse and quantized layouts as torch makes
    them, the grad, slots and dict deep-copied as torch always does.  Then `requires_grad` is
    put back.  `caller` is the frame that called `Tensor.__deepcopy__`; nothing of `tensor`
    changes, and the alias is kept alive as long as the memo (its id is a key there).

    In mode warn the tensor enters its copy's record as it is met, so that the record keeps
    the order of the copy, and leaves it again if its copy fails: then `DetachedCopyError`
    names the tensor's path, with torch's error as its cause (and not chained under the
    "graph leaves" refusal).
    """
    met = copy_.meet(tensor, caller, setting) if setting.mode is Mode.WARN else None
    try:
        with torch.no_grad():
            alias = tensor.detach()
            if type(alias) is not type(tensor):
                # Under torch-function-disabled redispatch detach() returns a plain Tensor.
                alias = alias.as_subclass(type(tensor))
            _give_state(tensor, alias)
            keep_alive(alias, memo)
            result: torch.Tensor = original(alias, memo)
    except Exception:
        _detached_copy_failed(copy_, met, tensor, caller)
        raise  # not torch's failure: the error of the user's code, unchanged
    memo[id(tensor)] = result
    if tensor.requires_grad:
        result.requires_grad_(True)
    return result


def _detached_copy_failed(copy_: _record.Copy, met: Any, tensor: torch.Tensor, caller: Any) -> None:
    """The detached copy of `tensor` raised (the exception being handled): nothing was
    detached.  If torch itself failed (its own code raised), raise `DetachedCopyError` naming
    the tensor, with torch's error as its cause; else return, and the caller re-raises the
    error of the code that raised it (a `__deepcopy__` of a value in the tensor's dict) as it
    is, the very object the detaching oracle raises."""
    if met is not None:
        copy_.forget(met)
    if not _raised_in_torch(sys.exc_info()[2]):
        return
    path = copy_.path_of(tensor, caller)
    error: Any = sys.exc_info()[1]
    raise DetachedCopyError(_report.detached_copy_failure(path, tensor, error), path=path) from error


_TORCH_DIR = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")


def _raised_in_torch(tb: Any) -> bool:
    """True if the innermost frame of the traceback `tb` runs torch's own code."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_TORCH_DIR)


def _give_state(tensor: torch.Tensor, alias: torch.Tensor) -> None:
    """Give the leaf `alias` what torch's deepcopy copies beside the data of `tensor`: its
    instance dict (shallow), slots and retained `.grad`."""
    state = existing_instance_dict(tensor)
    if state:
        alias.__dict__ = dict(state)
    cls = type(tensor)
    if cls is not torch.Tensor:
        for slot in copyreg._slotnames(cls):  # type: ignore[attr-defined]
            if hasattr(tensor, slot):
                setattr(alias, slot, getattr(tensor, slot))
    # .grad of a non-leaf is only readable without torch's warning when it is retained.
    if tensor.retains_grad and tensor.grad is not None:
        alias.grad = tensor.grad
