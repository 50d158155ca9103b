"""Hyperparameters that are not plain data (issue 36): with weights_only=False every one comes back as saved (as
Lightning, which pickles them); with the default plain-data load one that cannot be rebuilt under its annotation
is a CheckpointError at load time naming it and both fixes, never a dict handed to the task's __init__."""

from __future__ import annotations

import functools
import logging
import warnings

import pytest
import pytorch_lightning as pl
import torch

from tandem_core.errors import CheckpointError
from trainer import Task, Trainer

SGD = functools.partial(torch.optim.SGD, lr=0.1)
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class Ours(Task):
    def __init__(self, optimizer=SGD, act=torch.nn.Tanh, n=3):  # no annotations
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, n), act())

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).sum()

    def configure_optimizers(self):
        return self.hparams.optimizer(self.parameters())


class Theirs(pl.LightningModule):  # the same task under Lightning
    def __init__(self, optimizer=SGD, act=torch.nn.Tanh, n=3):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, n), act())

    training_step = Ours.training_step
    configure_optimizers = Ours.configure_optimizers


def _loader():
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)


def _saved(trainer_cls, module, path):
    trainer = trainer_cls(max_steps=1, default_root_dir=str(path.parent), **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, _loader())
    trainer.save_checkpoint(str(path))
    return str(path)


def _as_saved(hp):
    opt = hp["optimizer"]
    return type(opt).__name__, opt.func, opt.keywords, hp["act"], hp["n"]


def test_weights_only_false_gives_every_hyperparameter_back_as_saved(tmp_path):
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    kwargs = dict(optimizer=functools.partial(torch.optim.Adam, lr=0.01), act=torch.nn.ReLU, n=5)
    theirs = Theirs.load_from_checkpoint(_saved(pl.Trainer, Theirs(**kwargs), tmp_path / "pl.ckpt"),
                                         weights_only=False)  # fmt: skip
    ours = Ours.load_from_checkpoint(
        _saved(Trainer, Ours(**kwargs), tmp_path / "tandem.ckpt"), weights_only=False
    )
    assert _as_saved(ours.hparams) == _as_saved(theirs.hparams) == ("partial", torch.optim.Adam, {"lr": 0.01},
                                                                    torch.nn.ReLU, 5)  # fmt: skip
    assert isinstance(ours.net[1], torch.nn.ReLU)


def test_plain_data_load_refuses_an_unannotated_partial_naming_it_and_both_fixes(tmp_path):
    path = _saved(Trainer, Ours(), tmp_path / "tandem.ckpt")
    with pytest.raises(CheckpointError) as info:
        Ours.load_from_checkpoint(path)
    message = str(info.value)
    assert "hyper_parameters.optimizer" in message and "Callable[..., Optimizer]" in message
    assert "weights_only=False" in message
    again = Ours.load_from_checkpoint(path, optimizer=SGD, act=torch.nn.Tanh)
    assert again.hparams.n == 3  # passing the values by name is the third way


def test_a_dictconfig_from_a_checkpoint_never_calls_a_resolver_unless_trusted(monkeypatch):
    """A crafted checkpoint's DictConfig hyperparameter must not read the environment (${oc.env:...}, then logged
    to a tracker) or run a registered resolver when it is loaded by default; a reference to another value is
    plain data and stays."""
    pytest.importorskip("omegaconf")
    from tandem_core.errors import CheckpointError
    from trainer.checkpoint.format import OMEGACONF, decode

    monkeypatch.setenv("TANDEM_TEST_SECRET", "s3cr3t")
    crafted = {OMEGACONF: {"lr": 0.1, "nested": [{"key": "${oc.env:TANDEM_TEST_SECRET}"}]}}
    with pytest.raises(
        CheckpointError, match=r"resolver call.*oc\.env:TANDEM_TEST_SECRET.*weights_only=False"
    ):
        decode(crafted, path="run.ckpt")
    assert (
        decode(crafted, path="run.ckpt", trust=True).nested[0].key == "s3cr3t"
    )  # the trusted load: as saved
    plain = decode({OMEGACONF: {"a": 14, "ref": "${a}"}}, path="run.ckpt")
    assert plain.ref == 14
