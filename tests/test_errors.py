"""User mistakes raise TandemError subclasses whose message says what to change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import CheckpointError, ConfigError, TaskError
from trainer import TandemError, Task, Trainer


def data() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)


class Returns(Task):
    """training_step returns whatever `make(loss)` gives."""

    def __init__(self, make) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.make = make

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.make(F.mse_loss(self.net(x), y, reduction="none"))

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/mse", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(task: Task, tmp_path, **kw) -> Trainer:
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **{**FAST, **kw})
    trainer.fit(task, data())
    return trainer


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda loss: {"los": loss.mean()},
            r"returned dict; return the loss tensor, a dict with key 'loss', or None to skip the batch",
        ),
        (lambda loss: loss.mean().item(), r"returned float"),
        (lambda loss: loss, r"loss of shape \(4, 1\); reduce it to a scalar"),
        (lambda loss: loss.mean().detach(), r"does not require grad"),
    ],
)
def test_bad_training_step_output(tmp_path, make, match):
    with pytest.raises(TaskError, match=match):
        _fit(Returns(make), tmp_path)


def test_dict_with_loss_is_accepted(tmp_path):
    trainer = _fit(Returns(lambda loss: {"loss": loss.mean(), "extra": 1}), tmp_path)
    assert trainer.global_step == 2


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(
        ConfigError, match=r"unknown strategy 'deepspeedd'.*\(valid: 'auto', 'single'"
    ) as info:
        Trainer(strategy="deepspeedd", **FAST)
    with pytest.raises(
        ConfigError, match=r"strategy='deepspeed': DeepSpeed is not part of Tandem; use strategy='fsdp'"
    ):
        Trainer(strategy="deepspeed", **FAST)
    assert isinstance(info.value, TandemError)
    with pytest.raises(ConfigError, match="did you mean 'single'"):
        Trainer(strategy="singel", **FAST)
    with pytest.raises(ConfigError, match="strategy must be a name or a Strategy instance"):
        Trainer(strategy=3, **FAST)


def test_unknown_precision_lists_valid_names():
    with pytest.raises(
        ConfigError, match=r"unknown precision 'half' \(valid: '32-true', '64-true', 'bf16-mixed'"
    ):
        Trainer(precision="half", **FAST)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_epochs": -2}, r"max_epochs must be an int >= -1 \(-1 for no limit\), got -2"),
        ({"max_epochs": 1.5}, r"max_epochs must be an int"),
        ({"max_steps": -5}, r"max_steps must be an int >= -1"),
        ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches must be an int >= 1"),
        ({"limit_train_batches": 1.5}, r"limit_train_batches must be .* a float in \[0, 1\]"),
        ({"limit_val_batches": -1}, r"limit_val_batches must be an int >= 0"),
        ({"val_check_interval": 0}, r"val_check_interval must be an int >= 1"),
        ({"check_val_every_n_epoch": 0}, r"check_val_every_n_epoch must be an int >= 1 or None"),
        ({"gradient_clip_val": -1.0}, r"gradient_clip_val must be a number >= 0"),
        ({"gradient_clip_algorithm": "nrom"}, r"unknown gradient_clip_algorithm 'nrom', did you mean 'norm'"),
        ({"num_sanity_val_steps": -2}, r"num_sanity_val_steps must be an int >= -1"),
        ({"deterministic": "yes"}, r"deterministic must be True, False, 'warn' or None"),
        ({"devices": 0}, r"devices must be an int >= 1, -1, 'auto'"),
        ({"logger": "tensorboard"}, r"logger must be True, False, a Logger or a list of Loggers"),
        ({"callbacks": [object()]}, r"callbacks must be Callback instances"),
        ({"strategy": "single", "devices": 2}, r"strategy='single' runs on one device but devices=2"),
    ],
)
def test_bad_trainer_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(**{**FAST, **kwargs})


def test_missing_cuda_says_use_cpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="no CUDA GPU is visible; use accelerator='cpu'"):
        Trainer(**{**FAST, "accelerator": "cuda"})


def test_ckpt_path_that_does_not_exist(tmp_path):
    path = str(tmp_path / "missing.ckpt")
    with pytest.raises(CheckpointError, match=r"missing\.ckpt' does not exist; pass an existing file"):
        trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
        trainer.fit(Returns(lambda loss: loss.mean()), data(), ckpt_path=path)


def test_checkpoint_from_a_different_model(tmp_path):
    trainer = _fit(Returns(lambda loss: loss.mean()), tmp_path)
    path = str(tmp_path / "a.ckpt")
    trainer.save_checkpoint(path)

    class Wider(Returns):
        def __init__(self, make) -> None:
            super().__init__(make)
            self.net = nn.Linear(4, 2)
            self.head = nn.Linear(2, 1)

    with pytest.raises(CheckpointError, match=r"different model") as info:
        Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST).fit(
            Wider(lambda loss: loss.mean()), data(), ckpt_path=path
        )
    msg = str(info.value)
    assert "missing keys ['head.weight', 'head.bias']" in msg
    assert "net.weight: checkpoint (1, 4) vs model (2, 4)" in msg


def test_ckpt_path_last_without_checkpoint_callback(tmp_path):
    # as Lightning: a warning that names the fix, then a fresh start (the Lightning suite's
    # trainer/test_trainer.py; compared with Lightning in tests/test_lightning_parity_suite.py)
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
    with pytest.warns(
        UserWarning, match="no last checkpoint available.*ModelCheckpoint\\(\\.\\.\\., save_last=True\\)"
    ):
        trainer.fit(Returns(lambda loss: loss.mean()), data(), ckpt_path="last")
    assert trainer.global_step > 0


def test_missing_training_data(tmp_path):
    with pytest.raises(TaskError, match="fit\\(\\) needs training data: pass train_dataloaders"):
        Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST).fit(Returns(lambda loss: loss.mean()))


def test_missing_eval_data(tmp_path):
    for fn in ("validate", "test", "predict"):
        with pytest.raises(TaskError, match=f"{fn}\\(\\) needs data"):
            getattr(Trainer(default_root_dir=str(tmp_path), **FAST), fn)(Returns(lambda loss: loss.mean()))


def test_not_a_task(tmp_path):
    with pytest.raises(TaskError, match="needs a trainer.Task, got Linear"):
        Trainer(default_root_dir=str(tmp_path), **FAST).fit(nn.Linear(2, 2), data())


def test_missing_training_step_and_configure_optimizers(tmp_path):
    class Empty(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

    with pytest.raises(TaskError, match="must implement configure_optimizers"):
        _fit(Empty(), tmp_path)

    class NoStep(Empty):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(TaskError, match="must implement training_step"):
        _fit(NoStep(), tmp_path)


def test_trainer_property_before_fit():
    with pytest.raises(TaskError, match="not attached to a `Trainer`; call trainer.fit"):
        _ = Returns(lambda loss: loss).trainer


def test_log_non_scalar(tmp_path):
    class BadLog(Returns):
        def training_step(self, batch, batch_idx):
            self.log("vec", torch.ones(3))
            return super().training_step(batch, batch_idx)

    with pytest.raises(TaskError, match=r"self.log\('vec'\) got a tensor of shape \(3,\); log a scalar"):
        _fit(BadLog(lambda loss: loss.mean()), tmp_path)


def test_exception_reaches_on_exception_and_no_teardown_as_lightning(tmp_path):
    from callbacks import Callback

    seen: list[str] = []

    class Spy(Callback):
        def on_exception(self, trainer, task, exception):
            seen.append(type(exception).__name__)

        def teardown(self, trainer, task, stage):
            seen.append(f"teardown:{stage}")

    with pytest.raises(TaskError):
        _fit(Returns(lambda loss: {"los": loss}), tmp_path, callbacks=[Spy()])
    assert seen == ["TaskError"]  # Lightning 2.6 runs on_exception, not the teardown hooks, after an error


def test_manual_optimization_with_accumulation(tmp_path):
    class Manual(Returns):
        def __init__(self) -> None:
            super().__init__(lambda loss: loss.mean())
            self.automatic_optimization = False

    with pytest.raises(TaskError, match="accumulate_grad_batches applies to automatic optimization only"):
        _fit(Manual(), tmp_path, accumulate_grad_batches=2)


def test_ckpt_path_best(tmp_path):
    from callbacks import Callback

    with pytest.raises(
        ConfigError, match='ckpt_path="best"\\)` is set but `ModelCheckpoint` is not configured'
    ):
        Trainer(default_root_dir=str(tmp_path), **FAST).validate(
            Returns(lambda loss: loss), data(), ckpt_path="best"
        )

    trainer = _fit(Returns(lambda loss: loss.mean()), tmp_path)
    path = str(tmp_path / "best.ckpt")
    trainer.save_checkpoint(path)

    class FakeCheckpoint(Callback):
        best_model_path = path

    task = Returns(lambda loss: loss.mean())
    Trainer(default_root_dir=str(tmp_path), callbacks=[FakeCheckpoint()], **FAST).validate(
        task, data(), ckpt_path="best"
    )
    assert torch.equal(task.net.weight, trainer.task.net.weight)
