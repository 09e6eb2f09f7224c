"""gpytorch and botorch: prediction caches that their own copy protocols hide from deepcopy.

Native deepcopy of a GP after a prediction succeeds: ``DefaultPredictionStrategy.__deepcopy__``
returns None (gpytorch's own dodge of the graph-leaves error) and ``PairwiseGP.__deepcopy__`` sets
its caches to None around the copy.  The shim must leave those tensors hidden (strict succeeds,
warn says nothing) while still reporting the posterior tensors the copy does meet.
"""

from __future__ import annotations

import copy
import warnings

import pytest

gpytorch = pytest.importorskip("gpytorch")
botorch = pytest.importorskip("botorch")

import torch  # noqa: E402
from botorch.models import PairwiseGP, SingleTaskGP  # noqa: E402
from ecosystem_support import (  # noqa: E402
    assert_independent_copy,
    assert_like_native,
    assert_reports,
)


class ExactGPModel(gpytorch.models.ExactGP):
    def __init__(self, train_x, train_y, likelihood):
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class SGPRModel(gpytorch.models.ExactGP):
    """gpytorch's SGPR recipe: the base kernel is also an attribute of the model."""

    def __init__(self, train_x, train_y, likelihood):
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.base_covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        self.covar_module = gpytorch.kernels.InducingPointKernel(
            self.base_covar_module, inducing_points=train_x[:5].clone(), likelihood=likelihood)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


TEST_X = torch.linspace(0, 1, 7)


def predicted_exact_gp(model_cls=ExactGPModel):
    """A GP in eval mode after a prediction made with grad enabled (its caches are non-leaf)."""
    torch.manual_seed(0)
    train_x = torch.linspace(0, 1, 20)
    train_y = torch.sin(train_x * 6.28) + 0.1 * torch.randn(20)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    gp = model_cls(train_x, train_y, likelihood)
    gp.eval()
    likelihood.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # linear_operator's jitter notice for the SGPR
        pred = gp(TEST_X)
        pred.mean, pred.variance  # noqa: B018 - fill the lazy caches
    return gp


def gp_mean(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(TEST_X).mean


def test_exact_gp_after_prediction_copies_natively_in_every_mode():
    reports = assert_reports(predicted_exact_gp, lambda gp: copy.deepcopy(gp), ())
    native = reports.native[1]
    assert native.prediction_strategy is None
    for mode in ("warn", "strict", "silent"):
        gp, copied = reports.objects[mode], reports.results[mode]
        assert copied.prediction_strategy is None  # gpytorch's __deepcopy__ returned None
        assert gp.prediction_strategy is not None  # the source keeps its caches
        assert_like_native(copied, native)
        assert_independent_copy(gp, copied, gp_mean)


def test_exact_gp_prediction_distribution_reports_its_tensors():
    def make():
        gp = predicted_exact_gp()
        return gp(TEST_X)

    reports = assert_reports(make, lambda pred: copy.deepcopy(pred), ("loc", "_covar.tensor"),
                             copied_root=lambda pred, result: result)
    pred, copied = reports.objects["warn"], reports.results["warn"]
    assert isinstance(copied, gpytorch.distributions.MultivariateNormal)
    torch.testing.assert_close(copied.mean, pred.mean.detach())
    torch.testing.assert_close(copied.covariance_matrix, pred.covariance_matrix.detach())


def singletask_gp_after_posterior():
    torch.manual_seed(0)
    X = torch.rand(12, 2, dtype=torch.double)
    Y = X.sin().sum(-1, keepdim=True) + 0.05 * torch.randn(12, 1, dtype=torch.double)
    model = SingleTaskGP(X, Y)
    posterior = model.posterior(torch.rand(5, 2, dtype=torch.double))
    posterior.mean, posterior.variance  # noqa: B018
    return model, posterior


XT = torch.rand(5, 2, generator=torch.Generator().manual_seed(1), dtype=torch.double)


def test_singletask_gp_after_posterior_copies_natively_in_every_mode():
    reports = assert_reports(lambda: singletask_gp_after_posterior()[0], lambda m: copy.deepcopy(m), ())
    for mode in ("warn", "strict", "silent"):
        model, copied = reports.objects[mode], reports.results[mode]
        assert copied.prediction_strategy is None and model.prediction_strategy is not None
        assert_like_native(copied, reports.native[1])
        assert_independent_copy(model, copied, lambda m: m.posterior(XT).mean)


def test_model_and_posterior_dict_reports_only_the_posterior():
    def make():
        model, posterior = singletask_gp_after_posterior()
        return {"model": model, "posterior": posterior}

    expected = ("['posterior'].distribution.loc",
                "['posterior'].distribution._covar.left_linear_op.tensor")
    reports = assert_reports(make, lambda d: copy.deepcopy(d), expected,
                             copied_root=lambda d, result: result)
    # The six prediction-strategy caches under d['model'] stay hidden behind gpytorch's __deepcopy__.
    for mode in ("warn", "silent"):
        copied = reports.results[mode]
        assert copied["model"].prediction_strategy is None
        torch.testing.assert_close(copied["posterior"].mean, reports.objects[mode]["posterior"].mean.detach())


def test_prediction_strategy_cache_paths_spell_memoize_keys():
    """``_memoize_cache`` keys are tuples holding pickled kwargs (bytes): the paths spell them as
    literals, and they resolve."""
    def make():
        return singletask_gp_after_posterior()[0].prediction_strategy.lik_train_train_covar

    covar = make()
    cache = covar._memoize_cache
    cholesky = next(k for k in cache if k[0] == "cholesky")
    root_inv = next(k for k in cache if k[0] == "root_inv_decomposition")
    kernel_eval = next(k for k in covar._linear_op._memoize_cache if k[0] == "kernel_eval")
    assert isinstance(cholesky[2], bytes)
    expected = (
        f"_linear_op._memoize_cache[{kernel_eval!r}].tensor",
        "_diag_tensor.diag_values",
        f"_memoize_cache[{cholesky!r}]._tensor.tensor",
        f"_memoize_cache[{root_inv!r}].root._tensor.tensor",
    )
    assert_reports(make, lambda c: copy.deepcopy(c), expected, copied_root=lambda c, result: result)


def pairwise_gp_after_posterior():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        comparisons = torch.tensor([[0, 1], [2, 3], [4, 5], [1, 2]])
        model = PairwiseGP(torch.rand(6, 2, dtype=torch.double), comparisons)
        model.posterior(torch.rand(3, 2, dtype=torch.double))
    assert not model.utility.is_leaf and not model.covar.is_leaf
    return model


def test_pairwise_gp_keeps_its_own_deepcopy_and_side_effects():
    cached = {}

    def make():
        model = pairwise_gp_after_posterior()
        cached[id(model)] = (model.utility, model.covar)
        return model

    reports = assert_reports(make, lambda m: copy.deepcopy(m), ())
    native = reports.native[1]
    assert native.__dict__["__deepcopy__"] is None and native.utility is None
    for mode in ("warn", "strict", "silent"):
        model, copied = reports.objects[mode], reports.results[mode]
        # PairwiseGP.__deepcopy__'s side effects, exactly as native: the copy keeps the instance
        # attribute __deepcopy__ = None, the source a bound __deepcopy__, and its caches back.
        assert copied.__dict__["__deepcopy__"] is None
        assert model.__dict__["__deepcopy__"].__self__ is model
        assert (model.utility, model.covar) == cached[id(model)]
        assert copied.utility is None and copied.covar is None
        assert_like_native(copied, native)


def test_sgpr_custom_deepcopy_shares_its_caches_as_natively():
    """InducingPointKernel.__deepcopy__ hands its non-leaf kernel caches to the copy uncopied:
    native succeeds, so every mode must, and the caches stay shared."""
    reports = assert_reports(lambda: predicted_exact_gp(SGPRModel), lambda gp: copy.deepcopy(gp), ())
    native = reports.native[1]
    for mode in ("warn", "strict", "silent"):
        gp, copied = reports.objects[mode], reports.results[mode]
        assert copied.covar_module._cached_kernel_mat is gp.covar_module._cached_kernel_mat
        assert not gp.covar_module._cached_kernel_mat.is_leaf
        assert_like_native(copied, native)


def test_sgpr_user_cache_met_twice_through_fresh_memo_copies():
    """InducingPointKernel.__deepcopy__ copies its base kernel with a fresh memo: the tensor cached
    on the base kernel is met once through ``base_covar_module`` and again by that inner copy,
    which is one top-level copy for the user: one warning, and the tensor named once, at the
    first place the copy met it."""
    def make():
        gp = predicted_exact_gp(SGPRModel)
        gp.base_covar_module.last_k = gp.base_covar_module(torch.linspace(0, 1, 3)).to_dense()
        return gp

    reports = assert_reports(make, lambda gp: copy.deepcopy(gp),
                             ("base_covar_module.last_k",),
                             copied_root=lambda gp, result: result)
    copied = reports.results["silent"]
    # The inner fresh-memo copy breaks the tie between the two kernels, as it does natively.
    assert copied.covar_module.base_kernel is not copied.base_covar_module
    assert copied.covar_module.base_kernel.last_k.is_leaf
