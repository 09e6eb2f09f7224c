"""Lightning: weight-averaging callbacks deep-copy the LightningModule in ``setup()``.

``StochasticWeightAveraging.setup`` does ``deepcopy(pl_module)`` and ``EMAWeightAveraging`` builds
``torch.optim.swa_utils.AveragedModel(pl_module)``, which deep-copies it.  A module that ran one
forward with grad before ``fit`` (its ``last_hidden`` is non-leaf) natively makes ``fit`` fail in
setup.  With the shim the fit completes, the averaged model is an independent copy, and the
warning points at the line of this file that called ``fit``.
"""

from __future__ import annotations

import logging
import warnings

import pytest

L = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from ecosystem_support import assert_detached_twin, assert_independent_copy, assert_reports  # noqa: E402
from lightning.pytorch.callbacks import StochasticWeightAveraging  # noqa: E402

try:
    from lightning.pytorch.callbacks import EMAWeightAveraging
except ImportError:  # Lightning < 2.6
    EMAWeightAveraging = None


@pytest.fixture(autouse=True)
def _quiet_lightning():
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*isinstance\\(treespec, LeafSpec\\).*", FutureWarning)
        yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


class CachingModule(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, x):
        hidden = self.net[1](self.net[0](x))
        self.last_hidden = hidden  # a non-leaf activation kept on the module
        return self.net[2](hidden)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


X = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))


def loader():
    dataset = torch.utils.data.TensorDataset(X, X.sum(-1, keepdim=True))
    return torch.utils.data.DataLoader(dataset, batch_size=4)


class Run:
    """A module that ran one forward with grad before fit, its callback and its trainer."""

    def __init__(self, make_callback):
        torch.manual_seed(0)
        self.module = CachingModule()
        self.module(torch.randn(2, 4))
        self.cached_before_fit = self.module.last_hidden
        assert not self.cached_before_fit.is_leaf
        self.callback = make_callback()
        self.trainer = L.Trainer(
            max_steps=2, callbacks=[self.callback], accelerator="cpu", logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)

    def averaged(self):
        """The averaged copy of the module (SWA keeps the module copy, EMA an AveragedModel)."""
        average = self.callback._average_model
        return average.module if isinstance(average, torch.optim.swa_utils.AveragedModel) else average


CALLBACKS = {"swa": lambda: StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=1)}
if EMAWeightAveraging is not None:
    CALLBACKS["ema"] = lambda: EMAWeightAveraging()


@pytest.mark.parametrize("callback", sorted(CALLBACKS))
def test_weight_averaging_after_a_forward_with_grad(callback):
    make_callback = CALLBACKS[callback]
    reports = assert_reports(lambda: Run(make_callback), lambda run: run.trainer.fit(run.module, loader()),
                             ("last_hidden",), root=lambda run: run.module)
    assert "graph leaves" in str(reports.native[1])  # natively fit fails in the callback's setup
    for mode in ("warn", "silent"):
        run = reports.objects[mode]
        assert run.trainer.global_step == 2
        averaged = run.averaged()
        assert type(averaged) is CachingModule and averaged is not run.module
        assert averaged._trainer is None  # LightningModule.__getstate__ dropped the trainer
        # The copy holds a detached twin of the activation cached before fit (training has
        # replaced the source's since).
        assert_detached_twin(run.cached_before_fit, averaged.last_hidden)
        assert run.module.last_hidden is not run.cached_before_fit
        # The averaged copy is independent: no shared storage, and training one leaves the other.
        assert_independent_copy(run.module, averaged, (X,), same_outputs=False)
        assert_independent_copy(averaged, run.module, (X,), same_outputs=False)
    strict_run = reports.objects["strict"]
    assert strict_run.trainer.global_step == 0
