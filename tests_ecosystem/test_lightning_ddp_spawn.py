"""Lightning's ``ddp_spawn`` strategy (2 ranks, gloo over loopback, CPU) sends the trainer and the
LightningModule to each rank as ``torch.multiprocessing.start_processes`` arguments.  A module whose
hook-based ``weight_norm`` ran a forward with grad holds a ``weight`` with history: natively ``fit``
fails before any rank starts.  Activated by ``DEEPCOPY_SHIM`` alone (the script names no shim),
warn and silent train (each rank recomputes ``weight`` from ``weight_g``/``weight_v`` in its
forward) and the parent gets the trained weights back; strict refuses, naming the weight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

pytest.importorskip("lightning.pytorch")

SCRIPT = '''"""ddp_spawn of a model whose hook-based weight_norm has history: the mode is DEEPCOPY_SHIM's."""
import json
import torch
import torch.nn as nn
import lightning.pytorch as L


class Normed(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.utils.weight_norm(nn.Linear(4, 2))

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, index):
        return self(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.arange(32.0).reshape(8, 4) / 32)
        return torch.utils.data.DataLoader(data, batch_size=2)


def main():
    torch.manual_seed(0)
    model = Normed()
    model(torch.ones(1, 4))  # a forward with grad: layer.weight has history
    assert not model.layer.weight.is_leaf
    before = model.layer.weight_v.detach().clone()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_steps=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    report = {}
    try:
        trainer.fit(model)
    except Exception as exc:
        cause = exc.__cause__
        report["error"] = {"type": type(exc).__name__, "message": str(exc),
                           "paths": list(getattr(exc, "paths", ()) or ()),
                           "cause": type(cause).__name__ if cause is not None else None}
    else:
        report["fit"] = {"status": str(trainer.state.status),
                         "trained": not torch.equal(model.layer.weight_v.detach(), before)}
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
'''


def fit(tmp_path: Path, mode: str) -> Dict[str, Any]:
    script = tmp_path / "ddp_spawn_fit.py"
    script.write_text(SCRIPT)
    # PYTHONPATH, where set, is kept: the ranks import the package under test.
    env = {key: value for key, value in os.environ.items() if key != "DEEPCOPY_SHIM"}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    if mode != "off":
        env["DEEPCOPY_SHIM"] = mode
    stdout, stderr, returncode = run_bounded([sys.executable, str(script)], env, tmp_path, HARD_LIMIT)
    assert returncode == 0, stdout + stderr
    (line,) = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    result: Dict[str, Any] = json.loads(line[len("RESULT "):])
    result["stderr"] = stderr
    return result


# Seconds one fit may take, the ranks included (about 12 s on a 2-core machine).
HARD_LIMIT = 300


def run_bounded(args: List[str], env: Dict[str, str], cwd: Path, timeout: float) -> Tuple[str, str, int]:
    """Run the script in a session of its own; at `timeout` it and every rank it started are
    killed and the test fails: a hang (a rank waiting for the other forever) never blocks."""
    posix = hasattr(os, "killpg")
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=posix)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", ""
        pytest.fail(f"hung: killed after {timeout} s with its ranks\n{stdout}\n{stderr}")
    return stdout, stderr, proc.returncode


@pytest.mark.parametrize("mode", ["off", "warn", "strict", "silent"])
def test_ddp_spawn_of_a_weight_norm_model_with_history(tmp_path: Path, mode: str) -> None:
    result = fit(tmp_path, mode)
    if mode == "off":
        assert result["error"]["type"] == "RuntimeError"
        assert result["error"]["message"].startswith("Cowardly refusing to serialize non-leaf tensor")
    elif mode == "strict":
        assert result["error"]["type"] == "NonLeafTensorError" and result["error"]["cause"] == "RuntimeError"
        (path,) = result["error"]["paths"]
        assert path.endswith(".layer.weight"), path
    else:
        assert result["fit"] == {"status": "TrainerStatus.FINISHED", "trained": True}
    said = [line for line in result["stderr"].splitlines() if "DetachedTensorsWarning" in line]
    if mode == "warn":  # in the parent, where the ranks are started: one send, one warning
        assert len(said) == 1, result["stderr"]
        assert "sending a SpawnProcess to another process detached 1 tensor" in said[0]
        assert "layer.weight: grad_fn=WeightNormInterfaceBackward0" in result["stderr"]
    else:
        assert said == []
