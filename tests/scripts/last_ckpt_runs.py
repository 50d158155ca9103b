"""Which checkpoint files ModelCheckpoint writes, at which step, in small fits: run under Tandem by
tests/test_checkpoint_last.py, and under Lightning itself (imports rewritten by tests/ports/lightning_check.py)
by its slow test, which checks that both give the recorded lists.

``python last_ckpt_runs.py DIR`` prints one JSON line: {scenario: [[file name, global_step], ...]}, then the
target of last.ckpt for save_last="link", and the step of the weights test(ckpt_path="last") loaded.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from trainer import Task, Trainer

#: the validation score of each epoch: not monotonic, so some epochs save no top-1 checkpoint
SCORES = [5.0, 3.0, 4.0, 1.0, 2.0]


class Scored(Task):
    """Four steps per epoch; validation logs the epoch's score."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_score", SCORES[self.current_epoch])

    def test_step(self, batch, batch_idx):
        self.log("weights_sum", self.net.weight.sum())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data(n: int) -> DataLoader:
    return DataLoader(
        TensorDataset(torch.randn(n, 2, generator=torch.Generator().manual_seed(n))), batch_size=2
    )


SCENARIOS = {
    "top1_monitor": dict(monitor="val_score", save_top_k=1, save_last=True),
    "every_3_steps": dict(every_n_train_steps=3, save_last=True),
    "top0": dict(save_top_k=0, save_last=True),
    "link": dict(monitor="val_score", save_top_k=1, save_last="link"),
    "max_steps_mid_epoch": dict(save_last=True),
}


def run(name: str, root: str) -> dict[str, object]:
    """Fit one scenario; the files written, in order, with the global step of each."""
    torch.manual_seed(0)
    dirpath = os.path.join(root, name)
    cb = ModelCheckpoint(dirpath=dirpath, filename="{epoch}-{step}", **SCENARIOS[name])
    limits = dict(max_steps=6) if name == "max_steps_mid_epoch" else {}
    trainer = Trainer(
        max_epochs=len(SCORES),
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        **limits,
    )
    writes: list[list[object]] = []
    save = trainer.save_checkpoint

    def recording(path, *args, **kwargs):
        writes.append([os.path.basename(str(path)), trainer.global_step])
        return save(path, *args, **kwargs)

    trainer.save_checkpoint = recording
    task = Scored()
    trainer.fit(task, data(8), data(2))
    last = os.path.join(dirpath, "last.ckpt")
    target = os.readlink(last) if os.path.islink(last) else None
    tested = torch.load(last, weights_only=False)["global_step"] if os.path.exists(last) else None
    return {"writes": writes, "link": target, "last_step": tested}


def main(root: str) -> dict[str, object]:
    return {name: run(name, root) for name in SCENARIOS}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])))
