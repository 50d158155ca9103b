"""The moments users depend on, as Lightning has them (run on Lightning too by lightning_check): a frozen
submodule keeps its mode, a max_steps stop inside an epoch still ends the epoch and checkpoints, an
on_load_checkpoint that renames keys takes effect, and a DataModule comes back from a checkpoint."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import DataLoader

from tests.ports.harness import QUIET
from tests.ports.hookrec import Boring, BoringDataModule, RandomDataset
from trainer import Trainer


class Frozen(Boring):
    """Lightning's test_train_eval_mode_restored: a frozen BatchNorm must never train."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.nn.BatchNorm1d(32)
        self.frozen.eval()
        self.frozen.requires_grad_(False)
        self.modes: list[tuple[str, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.frozen(x))

    def _mode(self, where: str) -> None:
        self.modes.append((where, self.layer.training, self.frozen.training))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self._mode("train")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self._mode("val")
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        self._mode("test")
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        self._mode("predict")
        return super().predict_step(batch, batch_idx, dataloader_idx)


# Boring overrides these (so the hook-order tests see them called); here the defaults are meant: the loop then
# restores every submodule's own mode after evaluation
Frozen.on_validation_model_train = Boring.__mro__[1].on_validation_model_train  # type: ignore[attr-defined]
Frozen.on_test_model_train = Boring.__mro__[1].on_test_model_train  # type: ignore[attr-defined]


def test_a_frozen_batchnorm_stays_in_eval_mode_in_every_stage(tmp_path):
    task = Frozen()
    stats = task.frozen.running_mean.clone()
    trainer = Trainer(
        default_root_dir=str(tmp_path), max_epochs=2, val_check_interval=1, limit_train_batches=3,
        limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2, enable_checkpointing=False,
        logger=False, **QUIET,
    )  # fmt: skip
    trainer.fit(task)
    trainer.validate(task, verbose=False)
    trainer.test(task, verbose=False)
    trainer.predict(task)
    assert {m for m in task.modes if m[0] == "train"} == {("train", True, False)}
    assert {m[1:] for m in task.modes if m[0] != "train"} == {(False, False)}
    assert torch.equal(task.frozen.running_mean, stats)  # its statistics never moved
    assert task.layer.training and not task.frozen.training  # and the modes are back after every stage


def test_max_steps_inside_an_epoch_ends_the_epoch_and_checkpoints(tmp_path):
    ends: list[int] = []

    class Counting(Boring):
        def on_train_epoch_end(self) -> None:
            ends.append(self.global_step)

    trainer = Trainer(default_root_dir=str(tmp_path), max_steps=3, limit_val_batches=0, logger=False, **QUIET)
    trainer.fit(Counting())
    assert ends == [3]
    path = trainer.checkpoint_callback.best_model_path
    assert path and os.path.exists(path)
    assert torch.load(path, weights_only=True)["global_step"] == 3


def test_on_load_checkpoint_that_renames_keys_takes_effect(tmp_path):
    trainer = Trainer(default_root_dir=str(tmp_path), max_steps=2, limit_val_batches=0, logger=False, **QUIET)
    old = Boring()
    trainer.fit(old)
    path = os.path.join(str(tmp_path), "old.ckpt")
    trainer.save_checkpoint(path)

    class Renamed(Boring):
        """The layer was renamed from `layer` to `head` since the checkpoint was written."""

        def __init__(self) -> None:
            super().__init__()
            self.head = self.layer
            del self.layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.head.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            sd = checkpoint["state_dict"]
            for key in [k for k in sd if k.startswith("layer.")]:
                sd["head." + key[len("layer.") :]] = sd.pop(key)

    new = Renamed.load_from_checkpoint(path)
    assert torch.equal(new.head.weight, old.layer.weight)
    resumed = Renamed()
    Trainer(default_root_dir=str(tmp_path), max_steps=3, limit_val_batches=0, logger=False, **QUIET).fit(
        resumed, ckpt_path=path
    )
    assert resumed.global_step == 3


class SizedData(BoringDataModule):
    def __init__(self, size: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.seen = 0

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(self.hparams.size))

    def state_dict(self) -> dict[str, Any]:
        return {"seen": 7}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def test_a_datamodule_comes_back_from_a_checkpoint(tmp_path):
    trainer = Trainer(default_root_dir=str(tmp_path), max_steps=1, limit_val_batches=0, logger=False, **QUIET)
    trainer.fit(Boring(), datamodule=SizedData(32))
    path = os.path.join(str(tmp_path), "dm.ckpt")
    trainer.save_checkpoint(path)
    dm = SizedData.load_from_checkpoint(path)
    assert dm.hparams.size == 32 and dm.seen == 7
