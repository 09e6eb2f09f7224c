"""torch.distributions with parameters computed from trainable leaves (non-leaf tensors).

Each distribution keeps its parameters, and some keep more: a ``Categorical`` caches its lazy
``probs`` in ``__dict__``, transforms with ``cache_size=1`` keep ``_cached_x_y`` (``Transform.__getstate__``
drops only ``_inv``), ``MultivariateNormal`` keeps an expanded and an unbroadcast ``scale_tril``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from ecosystem_support import assert_reports
from torch import distributions as D
from torch import nn


class Params:
    """Trainable leaves and the non-leaf parameters computed from them."""

    def __init__(self):
        torch.manual_seed(0)
        self.loc_raw = torch.randn(3, requires_grad=True)
        self.scale_raw = torch.randn(3, requires_grad=True)
        self.loc = self.loc_raw * 2.0
        self.scale = nn.functional.softplus(self.scale_raw)


def normal():
    p = Params()
    return p, D.Normal(p.loc, p.scale)


def transformed():
    p = Params()
    dist = D.TransformedDistribution(D.Normal(p.loc, p.scale), [
        D.transforms.ExpTransform(cache_size=1),
        D.transforms.AffineTransform(loc=p.loc_raw, scale=2.0, cache_size=1)])
    dist.log_prob(dist.rsample())  # fills both transforms' caches
    return p, dist


def categorical():
    p = Params()
    dist = D.Categorical(logits=p.loc)
    dist.probs  # noqa: B018 - the lazy property stores a second non-leaf tensor
    return p, dist


def multivariate_normal():
    p = Params()
    return p, D.MultivariateNormal(p.loc, scale_tril=torch.diag(p.scale))


def independent():
    p = Params()
    return p, D.Independent(D.Normal(p.loc, p.scale), 1)


def leaf_normal():
    p = Params()
    return p, D.Normal(p.loc_raw, p.scale_raw.exp().detach())


CASES = {
    "normal": (normal, ("loc", "scale")),
    # The exp transform caches (x, y); the affine transform's x is the exp's y (met once).
    "transformed": (transformed, ("transforms[0]._cached_x_y[0]", "transforms[0]._cached_x_y[1]",
                                  "transforms[1]._cached_x_y[1]", "base_dist.loc", "base_dist.scale")),
    "categorical": (categorical, ("logits", "probs")),
    "multivariate_normal": (multivariate_normal, ("scale_tril", "loc", "_unbroadcasted_scale_tril")),
    "independent": (independent, ("base_dist.loc", "base_dist.scale")),
    "leaf_normal": (leaf_normal, ()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_distribution_copy(case):
    make, expected = CASES[case]
    sources = {}  # id(distribution) -> the leaves its parameters were computed from

    def build():
        params, dist = make()
        sources[id(dist)] = (dist, params)
        return dist

    reports = assert_reports(build, lambda d: copy.deepcopy(d), expected,
                             copied_root=lambda d, result: result)
    for mode in ("warn", "strict", "silent") if not expected else ("warn", "silent"):
        dist, copied = reports.objects[mode], reports.results[mode]
        params = sources[id(dist)][1]
        assert type(copied) is type(dist)
        value = dist.sample((4,))
        # (sampling refreshes the source transforms' caches with this value: the source's log_prob
        # reads the cached inverse, the copy's computes it, within float32 rounding)
        torch.testing.assert_close(copied.log_prob(value), dist.log_prob(value).detach(),
                                   rtol=1e-4, atol=1e-4)
        # The copy is a graph of its own leaves: gradients reach them, never the source's leaves.
        copied.log_prob(value).sum().backward()
        if expected:
            assert any(t.grad is not None for t in _leaves(copied))
            assert params.loc_raw.grad is None and params.scale_raw.grad is None


def _leaves(dist):
    found = [v for v in vars(dist).values() if isinstance(v, torch.Tensor) and v.is_leaf and v.requires_grad]
    base = getattr(dist, "base_dist", None)
    return found + (_leaves(base) if base is not None else [])


def test_categorical_paths_spell_logits():
    assert_reports(lambda: categorical()[1], lambda d: copy.deepcopy(d), CASES["categorical"][1])


def test_copy_does_not_send_gradients_into_the_source_graph():
    params, dist = transformed()
    with torch.no_grad():
        value = dist.sample((4,))
    from deepcopy_shim import enabled

    with enabled("silent"):
        copied = copy.deepcopy(dist)
    copied.log_prob(value).sum().backward()
    assert params.loc_raw.grad is None and params.scale_raw.grad is None
    dist.log_prob(value).sum().backward()  # the source's graph is intact and still its own
    assert params.loc_raw.grad is not None and params.scale_raw.grad is not None
