"""pyro: deepcopy with a memo subclass (``detach``/``deep_to``), constrained params, the param store.

``pyro.distributions.util.detach`` and ``deep_to`` call ``copy.deepcopy(obj, memo)`` with a dict
subclass whose ``get`` answers for every tensor, so deepcopy never calls ``Tensor.__deepcopy__``
and natively never refuses.  The shim's ``Module.__deepcopy__`` must pass that very memo through
(a fresh one makes ``detach`` raise) and its bookkeeping must not trip over the subclass's
``get``, which treats every key as an object id.
"""

from __future__ import annotations

import copy

import pytest

pyro = pytest.importorskip("pyro")

import torch  # noqa: E402
from ecosystem_support import assert_detached_twin, assert_like_native, assert_reports  # noqa: E402
from pyro import distributions as dist  # noqa: E402
from pyro.distributions.util import deep_to, detach  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.infer.autoguide import AutoNormal  # noqa: E402
from pyro.optim import Adam  # noqa: E402


class Cached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        self.cache = self.lin(x).relu()  # a non-leaf activation kept on the module
        return self.cache


def cached_module():
    torch.manual_seed(0)
    module = Cached()
    module(torch.randn(2, 4))
    assert not module.cache.is_leaf
    return module


def test_detach_with_memo_subclass_works_in_every_mode_as_natively():
    # find_nonleaf_tensors makes a plain deepcopy, which does meet the cache; detach() does not.
    reports = assert_reports(cached_module, lambda m: detach(m), (), scan=("cache",))
    native = reports.native[1]
    for mode in ("warn", "strict", "silent"):
        module, copied = reports.objects[mode], reports.results[mode]
        assert_like_native(copied, native)
        # detach's semantics: plain tensors sharing storage, no grad, the cache a leaf alias.
        assert type(copied.lin.weight) is torch.Tensor and not copied.lin.weight.requires_grad
        assert copied.lin.weight.data_ptr() == module.lin.weight.data_ptr()
        assert copied.cache.is_leaf and copied.cache.data_ptr() == module.cache.data_ptr()
        assert torch.equal(copied(torch.ones(1, 4)), module(torch.ones(1, 4)).detach())


def test_deep_to_with_memo_subclass_works_in_every_mode_as_natively():
    reports = assert_reports(cached_module, lambda m: deep_to(m, torch.float64), (), scan=("cache",))
    native = reports.native[1]
    assert not native.cache.is_leaf  # natively the memo's .to() copy keeps its history
    for mode in ("warn", "strict", "silent"):
        module, copied = reports.objects[mode], reports.results[mode]
        assert_like_native(copied, native)
        # deep_to's semantics: the source converted in place, its parameters shared with the copy,
        # the cache converted out of place (still with autograd history), the source's unchanged.
        assert module.lin.weight.dtype == torch.float64
        assert copied.lin.weight is module.lin.weight
        assert copied.cache.dtype == torch.float64 and module.cache.dtype == torch.float32
        assert type(copied.cache.grad_fn).__name__ == type(native.cache.grad_fn).__name__ == "ToCopyBackward0"


@pytest.fixture
def trained_guide():
    """One SVI step: a param store with a constrained param and an AutoNormal guide."""
    pyro.clear_param_store()

    def model(data):
        loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
        scale = pyro.param("obs_scale", torch.tensor(1.0), constraint=dist.constraints.positive)
        with pyro.plate("data", len(data)):
            pyro.sample("obs", dist.Normal(loc, scale), obs=data)

    guide = AutoNormal(model)
    svi = SVI(model, guide, Adam({"lr": 0.01}), Trace_ELBO())
    svi.step(torch.randn(10) + 3)
    yield guide
    pyro.clear_param_store()


def test_constrained_param_values_report_the_transformed_ones(trained_guide):
    store = pyro.get_param_store()
    values = {name: pyro.param(name) for name in store.keys()}
    # Constrained values are computed from the unconstrained leaf: exactly those are non-leaf.
    expected = tuple(f"[{name!r}]" for name, value in values.items() if not value.is_leaf)
    assert expected == ("['obs_scale']", "['AutoNormal.scales.loc']")
    reports = assert_reports(lambda: values, lambda v: copy.deepcopy(v), expected, fresh=False,
                             copied_root=lambda v, result: result)
    copied = reports.results["silent"]
    assert list(copied) == list(values)
    for name, value in values.items():
        if value.is_leaf:
            assert type(copied[name]) is type(value) and torch.equal(copied[name], value)
        else:
            assert_detached_twin(value, copied[name])


def test_param_store_state_is_leaf_only(trained_guide):
    store = pyro.get_param_store()
    reports = assert_reports(lambda: store.get_state(), lambda s: copy.deepcopy(s), ())
    state, copied = reports.objects["strict"], reports.results["strict"]
    assert list(copied["params"]) == list(state["params"])
    for name, value in state["params"].items():
        assert torch.equal(copied["params"][name], value) and copied["params"][name] is not value


def test_autoguide_copy_keeps_getstate_side_effects(trained_guide):
    """AutoGuide.__getstate__ clears the *source's* _model and master; the shim must reduce the
    guide through it, as native deepcopy does."""
    guide = trained_guide
    saved = guide._model
    assert saved is not None
    reports = assert_reports(lambda: guide, lambda g: copy.deepcopy(g), (), fresh=False)
    assert guide._model is None  # the library's own side effect, kept
    for mode in ("warn", "strict", "silent"):
        copied = reports.results[mode]
        assert type(copied) is AutoNormal and copied._model is None
        assert_like_native(copied, reports.native[1])
    guide._model = saved
