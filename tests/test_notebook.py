"""Notebooks: a real Jupyter kernel (ipykernel, driven by nbclient) runs `Trainer(strategy="ddp", devices=2)
.fit(task)` with workers forked from the kernel (strategies/fork.py); the task in the kernel ends with the
weights, step and metrics of the same code run as a script (`python train.py`, which re-runs itself once per
device). `dp` keeps working in the kernel, and `fsdp` refuses at once, saying what to use."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One user's code, run both as a notebook cell and as a script (then each worker re-runs it from the top).
CODE = """
import sys
sys.path.insert(0, {root!r})
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from trainer import Task, Trainer, seed_everything


class Net(Task):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 3)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


seed_everything(0)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(128, 6, generator=g), torch.randint(0, 3, (128,), generator=g))
task = Net()
trainer = Trainer(strategy={strategy!r}, devices=2, accelerator="cpu", max_epochs=2, deterministic=True,
                  logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
trainer.fit(task, DataLoader(data, batch_size=8, shuffle=True))
if trainer.is_global_zero:
    metrics = {{k: float(v) for k, v in trainer.callback_metrics.items()}}
    torch.save({{"weights": task.state_dict(), "step": trainer.global_step, "metrics": metrics}}, {out!r})
"""

FSDP_CELL = """
try:
    Trainer(strategy="fsdp", devices=2, accelerator="cpu", logger=False).fit(Net(), DataLoader(data, batch_size=8))
except Exception as e:
    print(f"REFUSED {type(e).__name__}: {e}")
"""


def _script(tmp_path, strategy: str) -> dict:
    out, path = tmp_path / f"script_{strategy}.pt", tmp_path / f"train_{strategy}.py"
    path.write_text(CODE.format(root=ROOT, strategy=strategy, out=str(out)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def _same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["metrics"] == b["metrics"], (
        a["step"],
        b["step"],
        a["metrics"],
        b["metrics"],
    )
    for k, v in a["weights"].items():
        assert torch.equal(v, b["weights"][k]), k


def test_ddp_in_a_jupyter_kernel_forks_and_equals_the_script(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="the notebook extra: pip install -e '.[notebook]'")
    nbclient = pytest.importorskip("nbclient", reason="the notebook extra: pip install -e '.[notebook]'")
    cells = [CODE.format(root=ROOT, strategy=s, out=str(tmp_path / f"nb_{s}.pt")) for s in ("ddp", "dp")]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in [*cells, FSDP_CELL]])
    start = time.monotonic()
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", cwd=str(tmp_path)).execute()
    took = time.monotonic() - start
    text = ["".join(o.get("text", "") for o in cell.outputs) for cell in nb.cells]
    assert "forking the 2 workers" in text[0], text[0]
    _same(torch.load(tmp_path / "nb_ddp.pt"), _script(tmp_path, "ddp"))
    _same(torch.load(tmp_path / "nb_dp.pt"), _script(tmp_path, "dp"))
    assert "REFUSED ConfigError" in text[2] and "put the code in a script" in text[2], text[2]
    print(f"\nnotebook (kernel start, ddp fit, dp fit, fsdp refusal): {took:.1f}s")
