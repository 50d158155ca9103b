"""Task: hyperparameters, what the Trainer provides to it, default steps."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import TaskError
from trainer import Task, Trainer


def data(n: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 4), torch.randn(n, 1)), batch_size=4)


class Base(Task):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


# ----- save_hyperparameters ----------------------------------------------------------------------


def test_save_hyperparameters_records_init_arguments():
    class T(Base):
        def __init__(self, lr: float = 0.1, hidden: int = 8, *, name: str = "x") -> None:
            super().__init__()
            local = "not a hyperparameter"  # noqa: F841
            self.save_hyperparameters()

    t = T(lr=0.5, name="y")
    assert t.hparams == {"lr": 0.5, "hidden": 8, "name": "y"}
    assert t.hparams.lr == 0.5
    with pytest.raises(AttributeError, match="no hyperparameter 'missing'"):
        _ = t.hparams.missing


def test_save_hyperparameters_names_and_ignore():
    class Named(Base):
        def __init__(self, lr=0.1, hidden=8, backbone=None) -> None:
            super().__init__()
            self.save_hyperparameters("lr", "hidden")

    class Ignoring(Base):
        def __init__(self, lr=0.1, backbone=None) -> None:
            super().__init__()
            self.save_hyperparameters(ignore="backbone")

    assert Named(lr=1.0, backbone=nn.Linear(1, 1)).hparams == {"lr": 1.0, "hidden": 8}
    assert Ignoring(backbone=nn.Linear(1, 1)).hparams == {"lr": 0.1}


def test_save_hyperparameters_with_kwargs():
    class T(Base):
        def __init__(self, lr=0.1, **kwargs) -> None:
            super().__init__()
            self.save_hyperparameters()

    assert T(lr=0.2, depth=3, act="relu").hparams == {"lr": 0.2, "depth": 3, "act": "relu"}


def test_hparams_survive_pickle_and_go_into_checkpoints(tmp_path):
    class T(Base):
        def __init__(self, lr=0.1, tag="a") -> None:
            super().__init__()
            self.save_hyperparameters()

    t = T(lr=0.3)
    assert pickle.loads(pickle.dumps(t.hparams)) == {"lr": 0.3, "tag": "a"}
    trainer = Trainer(max_steps=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(t, data())
    path = tmp_path / "h.ckpt"
    trainer.save_checkpoint(str(path))
    assert torch.load(path, weights_only=False)["hyper_parameters"] == {"lr": 0.3, "tag": "a"}


# ----- what the trainer provides -----------------------------------------------------------------


def test_trainer_device_step_and_epoch_properties(tmp_path):
    seen = []

    class T(Base):
        def training_step(self, batch, batch_idx):
            seen.append(
                (
                    self.trainer.global_step,
                    self.global_step,
                    self.current_epoch,
                    self.device,
                    self.global_rank,
                )
            )
            return super().training_step(batch, batch_idx)

    t = T()
    assert t.device == torch.device("cpu") and t.global_step == 0 and t.global_rank == 0
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(t, data())
    assert seen == [(i, i, i // 2, torch.device("cpu"), 0) for i in range(4)]
    assert t.trainer is trainer and trainer.lightning_module is t


def test_log_and_log_dict_reach_callback_metrics(tmp_path):
    losses: list[float] = []

    class T(Base):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            losses.append(loss.item())
            self.log("loss", loss, prog_bar=True)
            # per-batch values and epoch-only options: log_dict must pass both through to every item
            self.log_dict(
                {"a": float(batch_idx), "b": torch.tensor(2.0 * batch_idx)}, on_epoch=True, on_step=False
            )
            return loss

    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(T(), data())
    m = trainer.callback_metrics
    assert float(m["loss"]) == pytest.approx(losses[-1])  # the last step's value
    assert float(m["a"]) == 0.5 and float(m["b"]) == 1.0  # epoch means over batches 0 and 1
    assert trainer.progress_bar_metrics.keys() == {"loss"}  # prog_bar=True only for "loss"
    assert trainer.progress_bar_metrics["loss"] == pytest.approx(losses[-1])


def test_log_outside_a_trainer_is_a_no_op(tmp_path):
    class Logs(Base):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    t = Logs()
    t.log("outside", 1.0)  # e.g. a forward() called in a notebook: no error, nothing kept
    t.log_dict({"also_outside": 2.0})
    trainer = Trainer(max_steps=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(t, data())
    assert trainer.callback_metrics.keys() == {"loss"}  # what was logged during fit, and only that


def test_default_predict_step_uses_forward(tmp_path):
    t = Base()
    x = torch.randn(8, 4)
    out = Trainer(default_root_dir=str(tmp_path), **FAST).predict(
        t, DataLoader(TensorDataset(x), batch_size=4)
    )
    assert len(out) == 2
    torch.testing.assert_close(torch.cat(out), t.net(x).detach())

    class NoForward(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

    with pytest.raises(TaskError, match="needs forward\\(\\) or predict_step\\(\\)"):
        Trainer(default_root_dir=str(tmp_path), **FAST).predict(NoForward(), DataLoader(TensorDataset(x), 4))


def test_task_is_a_module_and_moves_with_precision(tmp_path):
    t = Base()
    Trainer(max_steps=1, precision="64", default_root_dir=str(tmp_path), **FAST).fit(t, data())
    assert t.net.weight.dtype == torch.float64
    assert isinstance(t, nn.Module) and "net.weight" in t.state_dict()


def test_print_only_on_rank_zero(capsys, monkeypatch, tmp_path):
    t = Base()
    t.print("before", "fit", sep="-")  # no trainer yet: rank 0
    assert capsys.readouterr().out == "before-fit\n"
    trainer = Trainer(max_steps=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(t, data())
    t.print("rank", 0)
    trainer.print("trainer", 0)
    assert capsys.readouterr().out == "rank 0\ntrainer 0\n"
    monkeypatch.setattr(type(trainer.strategy.comm), "rank", property(lambda self: 1))  # as on rank 1
    t.print("rank", 1)
    trainer.print("trainer", 1)
    assert capsys.readouterr().out == ""


def test_train_eval_modes_during_fit(tmp_path):
    modes = []

    class T(Base):
        def training_step(self, batch, batch_idx):
            modes.append(("train", self.training))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            modes.append(("val", self.training))

    t = T()
    Trainer(max_epochs=1, default_root_dir=str(tmp_path), **{**FAST, "num_sanity_val_steps": 1}).fit(
        t, data(), data(4)
    )
    assert modes == [("val", False), ("train", True), ("train", True), ("val", False)]
    assert t.training  # back in training mode after validation


def test_no_grad_during_validation(tmp_path):
    grads = []

    class T(Base):
        def validation_step(self, batch, batch_idx):
            grads.append(torch.is_grad_enabled())

    Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST).fit(T(), data(), data(4))
    assert grads == [False]
