"""Lightning's StochasticWeightAveraging callback on a model with hook-based weight_norm.

The callback deep-copies the LightningModule when fitting starts; the hook-based
`torch.nn.utils.weight_norm` leaves `body[0].weight` with a grad_fn from the moment it is applied,
so without the shim that copy raises the "graph leaves" error.  Run:

    python examples/lightning_swa.py
"""

import logging
import warnings

import lightning as L
import torch
import torch.nn as nn
from lightning.pytorch.callbacks import StochasticWeightAveraging
from torch.utils.data import DataLoader, TensorDataset

import deepcopy_shim

# Notices of other libraries, not of the shim: silenced, so that what you see is what the shim says.
warnings.filterwarnings("ignore", r"`?torch\.nn\.utils\.weight_norm`? is deprecated")
warnings.filterwarnings("ignore", module="lightning")  # its hints and deprecations
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # "GPU available", tips


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.utils.weight_norm(nn.Linear(8, 16)), nn.ReLU())
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)
    model = Regressor()
    trainer = L.Trainer(
        max_epochs=4,
        accelerator="cpu",
        devices=1,
        callbacks=[StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    deepcopy_shim.enable("silent")
    trainer.fit(model, data)
    deepcopy_shim.disable()
    assert trainer.current_epoch == 4
    print("Lightning SWA finished: final loss", float(trainer.callback_metrics.get("train_loss", torch.nan)))


if __name__ == "__main__":
    main()
