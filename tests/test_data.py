"""Data plumbing: counting and limiting batches, rebuilding loaders, skipping consumed batches, DataModule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

from strategies.data.reinit import rebuild, rebuildable
from tandem_core.errors import ConfigError
from trainer import DataModule, Task, Trainer
from trainer.loop.data import SkipBatchSampler, num_batches, set_epoch


def tensors(n: int = 20) -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))


class Stream(IterableDataset):
    """An iterable data set without a length; counts the samples it yields."""

    def __init__(self, n: int = 20) -> None:
        self.data = tensors(n)
        self.reads = 0

    def __iter__(self):
        for i in range(len(self.data)):
            self.reads += 1
            yield self.data[i]


class Net(Task):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 1))
        self.batches: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.batches.append(x)
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


# ----- num_batches -------------------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "expected"), [(1.0, 5), (0.5, 2), (0.0, 0), (3, 3), (9, 5), (0, 0)])
def test_num_batches_of_sized_loader(limit, expected):
    assert num_batches(DataLoader(tensors(), batch_size=4), limit) == expected


def test_num_batches_of_iterable_loader():
    loader = DataLoader(Stream(), batch_size=4)
    assert num_batches(loader, 1.0) == float("inf")
    assert num_batches(loader, 3) == 3
    with pytest.raises(ConfigError, match="needs a loader with a length; pass an int"):
        num_batches(loader, 0.5)


def test_num_batches_small_fraction_is_an_error_not_zero():
    with pytest.raises(ConfigError, match="less than one batch; pass at least 0.2 or an int"):
        num_batches(DataLoader(tensors(), batch_size=4), 0.1)


@pytest.mark.parametrize("limit", [-1, 1.5, True])
def test_num_batches_rejects_bad_limits(limit):
    with pytest.raises(ConfigError):
        num_batches(DataLoader(tensors(), batch_size=4), limit)


# ----- rebuilding and skipping -------------------------------------------------------------------


def test_rebuildable():
    class MyLoader(DataLoader):
        pass

    assert rebuildable(DataLoader(tensors()))
    assert not rebuildable(DataLoader(Stream()))
    assert not rebuildable(MyLoader(tensors()))
    assert not rebuildable([1, 2])


def test_rebuild_keeps_arguments():
    def collate(items):
        return torch.stack([x for x, _ in items])

    g = torch.Generator()
    loader = DataLoader(
        tensors(), batch_size=3, shuffle=True, drop_last=True, collate_fn=collate, generator=g
    )
    copy = rebuild(loader)
    assert copy.batch_size == 3 and copy.drop_last and copy.collate_fn is collate and copy.generator is g
    assert isinstance(copy.sampler, RandomSampler) and len(copy) == 6
    g.manual_seed(0)
    a = [b.clone() for b in loader]
    g.manual_seed(0)
    assert all(torch.equal(x, y) for x, y in zip(a, copy))


def test_rebuild_with_custom_batch_sampler():
    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=4, drop_last=False)
    loader = DataLoader(tensors(10), batch_sampler=sampler)
    copy = rebuild(loader, batch_sampler=SkipBatchSampler(sampler, 1))
    assert [len(x) for x, _ in copy] == [4, 2]


def test_skip_batch_sampler_yields_the_rest_without_reading():
    inner = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    s = SkipBatchSampler(inner, 2)
    assert len(s) == 2
    assert list(s) == [[6, 7, 8], [9]]
    assert list(SkipBatchSampler(inner, 5)) == [] and len(SkipBatchSampler(inner, 5)) == 0


def test_skip_batch_sampler_draws_the_same_permutation():
    torch.manual_seed(3)
    full = list(BatchSampler(RandomSampler(range(12)), batch_size=4, drop_last=False))
    torch.manual_seed(3)
    s = SkipBatchSampler(BatchSampler(RandomSampler(range(12)), batch_size=4, drop_last=False), 1)
    it = iter(s)
    s.prime()  # the random draw happens here, when the caller chooses
    assert [next(it), next(it)] == full[1:]
    with pytest.raises(StopIteration):
        next(it)


def test_set_epoch_reaches_samplers():
    class EpochSampler(SequentialSampler):
        epoch = -1

        def set_epoch(self, epoch):
            self.epoch = epoch

    sampler = EpochSampler(range(8))
    loader = DataLoader(tensors(8), batch_size=4, sampler=sampler)
    set_epoch(loader, 3)
    assert sampler.epoch == 3
    set_epoch([1, 2], 1)  # no sampler: nothing to do


# ----- in the trainer ----------------------------------------------------------------------------


def test_iterable_dataset_with_limit(tmp_path):
    torch.manual_seed(0)
    task, stream = Net(), Stream()
    trainer = Trainer(max_epochs=2, limit_train_batches=3, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(stream, batch_size=4))
    assert trainer.global_step == 6 and len(task.batches) == 6
    assert stream.reads <= 2 * (3 * 4 + 4)  # at most one batch read ahead per epoch


def test_iterable_dataset_runs_whole_stream_per_epoch(tmp_path):
    torch.manual_seed(0)
    task = Net()
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(Stream(), batch_size=4))
    assert trainer.global_step == 10 and trainer.current_epoch == 2


def test_iterable_dataset_resume_is_exact(tmp_path):
    def run(seed=0, **kw):
        torch.manual_seed(seed)
        task = Net()
        trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **{**FAST, **kw})
        trainer.fit(task, DataLoader(Stream(), batch_size=4))
        return task, trainer

    a, _ = run()
    _, tb = run(max_steps=3)
    path = str(tmp_path / "s.ckpt")
    tb.save_checkpoint(path)
    torch.manual_seed(1)
    b = Net()
    Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST).fit(
        b, DataLoader(Stream(), 4), ckpt_path=path
    )
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert torch.equal(b.batches[0], a.batches[3])


class Data(DataModule):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.restored: dict | None = None

    def prepare_data(self):
        self.calls.append("prepare_data")

    def setup(self, stage):
        self.calls.append(f"setup:{stage.value}")  # a TrainerFn, as Lightning passes
        self.train, self.val = tensors(16), tensors(8)

    def teardown(self, stage):
        self.calls.append(f"teardown:{stage.value}")

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=4, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=4)

    def test_dataloader(self):
        return DataLoader(self.val, batch_size=8)

    def state_dict(self):
        return {"version": 2}

    def load_state_dict(self, state):
        self.restored = state


def test_datamodule_fit_validate_test(tmp_path):
    dm = Data()
    torch.manual_seed(0)
    task = Net()
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, datamodule=dm)
    assert trainer.global_step == 8 and "val/loss" in trainer.callback_metrics
    assert dm.calls == ["prepare_data", "setup:fit", "teardown:fit"]
    out = trainer.validate(task, datamodule=dm)
    assert list(out[0]) == ["val/loss"]
    out = trainer.test(task, datamodule=dm)
    assert list(out[0]) == ["test/loss"]
    assert dm.calls[3:] == [
        "prepare_data",
        "setup:validate",
        "teardown:validate",
        "prepare_data",
        "setup:test",
        "teardown:test",
    ]


def test_datamodule_as_positional_fit_argument_and_state(tmp_path):
    dm = Data()
    torch.manual_seed(0)
    trainer = Trainer(max_steps=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(Net(), dm)
    path = str(tmp_path / "dm.ckpt")
    trainer.save_checkpoint(path)
    dm2 = Data()
    Trainer(max_steps=3, default_root_dir=str(tmp_path), **FAST).fit(Net(), datamodule=dm2, ckpt_path=path)
    assert dm2.restored == {"version": 2}


def test_explicit_loaders_beat_the_task_methods(tmp_path):
    class WithLoaders(Net):
        def train_dataloader(self):
            return DataLoader(tensors(8), batch_size=4)

    torch.manual_seed(0)
    task = WithLoaders()
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task)
    assert trainer.global_step == 2
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(tensors(12), batch_size=4))
    assert trainer.global_step == 3
