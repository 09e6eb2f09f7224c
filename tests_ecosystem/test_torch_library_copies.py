"""Copies torch makes itself: ``nn.TransformerEncoder`` clones its layer with ``copy.deepcopy``
once per layer (``_get_clones``), and ``torch.optim.swa_utils.AveragedModel`` deep-copies the
model it averages (the mechanism behind Lightning's ``EMAWeightAveraging``).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from ecosystem_support import assert_detached_twin, assert_independent_copy, assert_reports
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

SRC = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))


class CachingEncoderLayer(nn.TransformerEncoderLayer):
    def forward(self, src, *args, **kwargs):
        out = super().forward(src, *args, **kwargs)
        self.last_out = out
        return out


def used_layer():
    torch.manual_seed(0)
    layer = CachingEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    layer(SRC)
    return layer


@pytest.fixture(autouse=True)
def _no_nested_tensor_notice():
    # nn.TransformerEncoder: "enable_nested_tensor is True, but self.use_nested_tensor is False ..."
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "enable_nested_tensor is True", UserWarning)
        yield


def test_encoder_built_from_a_layer_that_ran_with_grad():
    """Natively the constructor fails; with the shim each clone is one top-level copy (one
    warning each)."""
    reports = assert_reports(used_layer, lambda layer: nn.TransformerEncoder(layer, num_layers=2),
                             ("last_out",), copies=2)
    for mode in ("warn", "silent"):
        layer, enc = reports.objects[mode], reports.results[mode]
        assert enc.layers[0] is not enc.layers[1]
        for clone in enc.layers:
            assert_detached_twin(layer.last_out, clone.last_out)
            assert_independent_copy(layer, clone, (SRC,))


def test_encoder_after_a_forward():
    def make():
        torch.manual_seed(0)
        layer = CachingEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        enc = nn.TransformerEncoder(layer, num_layers=2)
        enc(SRC)
        return enc

    expected = ("layers[0].last_out", "layers[1].last_out")
    reports = assert_reports(make, lambda enc: copy.deepcopy(enc), expected,
                             copied_root=lambda enc, result: result)
    for mode in ("warn", "silent"):
        assert_independent_copy(reports.objects[mode], reports.results[mode], (SRC,))


class Cached(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.hidden = self.net[1](self.net[0](x))
        self.seen += 1
        return self.net[2](self.hidden)


X = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))


def test_averaged_model_of_a_model_with_cached_activation():
    def make():
        torch.manual_seed(0)
        model = Cached()
        model(X)
        return model

    ema = get_ema_multi_avg_fn(0.9)
    reports = assert_reports(make, lambda m: AveragedModel(m, multi_avg_fn=ema, use_buffers=True),
                             ("hidden",), copied_root=lambda m, averaged: averaged.module)
    for mode in ("warn", "silent"):
        model, averaged = reports.objects[mode], reports.results[mode]
        assert_independent_copy(model, averaged.module, (X,))
        averaged.update_parameters(model)
        assert averaged.n_averaged.item() == 1
