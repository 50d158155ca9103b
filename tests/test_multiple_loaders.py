"""Several loaders (dict, list, nested, CombinedLoader in each mode) in fit/validate/test/predict, against a
Lightning Trainer on the same data and task: the batches every step receives (with batch_idx and
dataloader_idx), the batch counts under limit_*_batches, and the trained weights. Then an exact mid-epoch
resume of a shuffled combined loader whose shorter loader cycles on both sides of the checkpoint."""

from __future__ import annotations

import os
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from conftest import FAST
from pytorch_lightning.utilities import CombinedLoader as LightningCombined
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tandem_core.errors import ConfigError
from trainer import Task, Trainer
from trainer.utilities import CombinedLoader

PL = dict(
    accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False, num_sanity_val_steps=0,
)  # fmt: skip


def plain(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    return [t for v in (x if isinstance(x, (list, tuple)) else []) for t in tensors(v)]


class Steps:
    """What every step saw; the loss uses every tensor of the (combined) batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(2, 1)
        self.seen: dict[str, list[Any]] = {"train": [], "val": [], "test": [], "predict": []}

    def _loss(self, batch: Any) -> torch.Tensor:
        return sum(self.lin(t.float() / 100).pow(2).mean() for t in tensors(batch))  # (small: no divergence)

    def training_step(self, batch, batch_idx):
        self.seen["train"].append((batch_idx, plain(batch)))
        return self._loss(batch)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.seen["val"].append((dataloader_idx, batch_idx, plain(batch)))

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.seen["test"].append((dataloader_idx, batch_idx, plain(batch)))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self.seen["predict"].append((dataloader_idx, batch_idx, plain(batch)))
        return torch.stack([t.float().sum() for t in tensors(batch)]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Ours(Steps, Task):
    pass


class Theirs(Steps, pl.LightningModule):
    pass


def loader(n: int, batch_size: int, start: int = 0, shuffle: bool = False) -> DataLoader:
    x = torch.arange(start, start + 2 * n, dtype=torch.float32).view(n, 2)
    return DataLoader(TensorDataset(x), batch_size=batch_size, shuffle=shuffle)


def train_data(kind: str) -> Any:
    a, b, c = loader(5, 2), loader(9, 2, 100), loader(3, 1, 200)
    return {
        "dict": {"a": a, "b": b},
        "list": [a, b, c],
        "nested": {"x": [a, c], "y": {"z": b}},
        "min_size": CombinedLoader({"a": a, "b": b}, "min_size"),
        "max_size": CombinedLoader({"a": a, "b": b}, "max_size"),
        "max_size_cycle": CombinedLoader([a, b], "max_size_cycle"),
    }[kind]


def as_lightning(data: Any) -> Any:
    """The same loaders, a CombinedLoader of ours given as Lightning's own."""
    return LightningCombined(data.iterables, data.mode) if isinstance(data, CombinedLoader) else data


def both(run, **options: Any) -> tuple[tuple[Ours, Any], tuple[Theirs, Any]]:
    ours, theirs = Ours(), Theirs()
    t_ours = Trainer(**FAST, **options)
    t_theirs = pl.Trainer(**PL, **options)
    return (ours, run(t_ours, ours, False)), (theirs, run(t_theirs, theirs, True))


@pytest.mark.parametrize("kind", ["dict", "list", "nested", "min_size", "max_size", "max_size_cycle"])
@pytest.mark.parametrize("limit", [1.0, 3])
def test_fit_sees_lightnings_batches_and_ends_with_its_weights(kind, limit):
    def run(trainer, task, lightning):
        data = train_data(kind)
        trainer.fit(task, as_lightning(data) if lightning else data)
        return trainer.num_training_batches

    (ours, n_ours), (theirs, n_theirs) = both(run, max_epochs=2, limit_train_batches=limit)
    assert n_ours == n_theirs
    assert ours.seen["train"] == theirs.seen["train"] and ours.seen["train"]
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q)


def test_validation_test_and_predict_with_dicts_nested_and_combined():
    def evals():
        return {
            "val": {"a": loader(3, 2), "b": [loader(2, 1, 50), loader(4, 3, 60)]},
            "test": [loader(3, 2), {"c": loader(5, 2, 70)}],
            "predict": {"p": loader(3, 2), "q": loader(2, 2, 90)},
        }

    def run(trainer, task, lightning):
        d = evals()
        trainer.fit(task, loader(4, 2), d["val"])
        n_val = list(trainer.num_val_batches)
        trainer.test(task, d["test"])
        n_test = list(trainer.num_test_batches)
        out = trainer.predict(task, d["predict"])
        return n_val, n_test, list(trainer.num_predict_batches), [[float(v) for v in o] for o in out]

    (ours, got), (theirs, want) = both(run, max_epochs=1, limit_val_batches=2)
    assert got == want
    for stage in ("val", "test", "predict"):
        assert ours.seen[stage] == theirs.seen[stage] and ours.seen[stage], stage


@pytest.mark.parametrize("mode", ["min_size", "max_size", "max_size_cycle"])
def test_validation_of_a_combined_loader_gets_combined_batches(mode):
    def run(trainer, task, lightning):
        val = {"a": loader(3, 2), "b": loader(5, 2, 40)}
        trainer.validate(task, (LightningCombined if lightning else CombinedLoader)(val, mode))
        return trainer.num_val_batches

    (ours, n), (theirs, m) = both(run)
    assert n == m and ours.seen["val"] == theirs.seen["val"] and ours.seen["val"]


def test_modes_training_and_predict_refuse():
    trainer = Trainer(max_epochs=1, **FAST)
    with pytest.raises(ConfigError, match="sequential"):
        trainer.fit(Ours(), CombinedLoader([loader(2, 1), loader(3, 1)], "sequential"))
    with pytest.raises(ConfigError, match="sequential"):
        Trainer(**FAST).predict(Ours(), CombinedLoader([loader(2, 1), loader(3, 1)], "max_size"))


def test_the_dict_keys_are_not_the_batches():
    """The old bug: a dict of loaders was iterated as one iterable, training_step got the keys."""
    task = Ours()
    Trainer(max_epochs=1, **FAST).fit(task, {"a": loader(2, 1), "b": loader(2, 1, 10)})
    assert [b for _, b in task.seen["train"]] == [
        {"a": [[[0.0, 1.0]]], "b": [[[10.0, 11.0]]]},  # (a TensorDataset's batch is the list [x])
        {"a": [[[2.0, 3.0]]], "b": [[[12.0, 13.0]]]},
    ]


# ---- exact mid-epoch resume ----------------------------------------------------------------------------


class Noisy(Ours):
    """Dropout-like random draws in the step, so a wrong RNG state after the resume shows."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * (1 + torch.rand(()))


class Crash(Exception):
    pass


class SaveAndCrash(Callback):
    def __init__(self, path: str, at: tuple[int, int]) -> None:
        self.path, self.at = path, at

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == self.at:
            trainer.save_checkpoint(self.path)
            raise Crash


def resume_data() -> Any:
    # "a" (3 batches, shuffled) is started again at batch 3 and 6; "b" (8 batches, shuffled) sets the length
    return {"a": loader(6, 2, shuffle=True), "b": loader(16, 2, 100, shuffle=True)}


def _run(callbacks: list[Callback], ckpt: str | None = None, seed: int = 0) -> Noisy:
    torch.manual_seed(seed)
    task = Noisy()
    torch.manual_seed(seed)
    try:
        Trainer(max_epochs=2, callbacks=callbacks, **FAST).fit(task, resume_data(), ckpt_path=ckpt)
    except Crash:
        pass
    return task


@pytest.mark.parametrize("at", [(0, 4), (1, 1), (1, 6)])  # after a's restart; before; after two restarts
def test_resume_inside_a_combined_epoch_equals_an_uninterrupted_run(tmp_path, at):
    path = os.path.join(tmp_path, "mid.ckpt")
    full = _run([])
    stopped = _run([SaveAndCrash(path, at)])
    resumed = _run([], ckpt=path, seed=123)  # another RNG state: only the checkpoint's may count
    assert stopped.seen["train"] + resumed.seen["train"] == full.seen["train"]
    assert resumed.seen["train"][0][0] == at[1] + 1  # the step after the checkpoint's
    for p, q in zip(resumed.parameters(), full.parameters()):
        assert torch.equal(p, q)


class Stateful:
    """A loader with state_dict/load_state_dict (Lightning's Stateful, e.g. torchdata's StatefulDataLoader): its
    order comes from a seed it was built with, so only its saved state can continue a run built with another."""

    def __init__(self, seed: int) -> None:
        self.seed, self.pass_, self.pos = seed, 0, 0

    def _order(self) -> list[int]:
        return torch.randperm(
            8, generator=torch.Generator().manual_seed(self.seed * 100 + self.pass_)
        ).tolist()

    def __len__(self) -> int:
        return 4

    def __iter__(self):
        if self.pos >= 4:  # the last pass was complete: a new one (a pass cut short continues)
            self.pass_, self.pos = self.pass_ + 1, 0
        order = self._order()
        while self.pos < 4:
            i = order[2 * self.pos : 2 * self.pos + 2]
            self.pos += 1
            yield [torch.tensor([[float(i[0]), float(i[1])]])]

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "pass_": self.pass_, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.pass_, self.pos = state["seed"], state["pass_"], state["pos"]


@pytest.mark.parametrize("combined", [True, False])
def test_stateful_loaders_continue_from_their_saved_state(tmp_path, combined):
    path = os.path.join(tmp_path, "mid.ckpt")

    def run(callbacks, seed, ckpt=None):
        torch.manual_seed(0)
        task = Noisy()
        data = {"s": Stateful(seed), "b": loader(10, 2, 100, shuffle=True)} if combined else Stateful(seed)
        try:
            Trainer(max_epochs=2, callbacks=callbacks, **FAST).fit(task, data, ckpt_path=ckpt)
        except Crash:
            pass
        return task

    full = run([], 1)
    stopped = run([SaveAndCrash(path, (1, 2))], 1)
    resumed = run([], 2, path)  # built with another seed: only the checkpoint's state gives the right order
    assert stopped.seen["train"] + resumed.seen["train"] == full.seen["train"]
    for p, q in zip(resumed.parameters(), full.parameters()):
        assert torch.equal(p, q)


def test_swa_recomputes_batch_norm_over_the_combined_batches():
    from callbacks import StochasticWeightAveraging

    class WithNorm(Ours):
        def __init__(self) -> None:
            super().__init__()
            self.bn, self.no_grad_batches = nn.BatchNorm1d(2), []

        def training_step(self, batch, batch_idx):
            if not torch.is_grad_enabled():  # SWA's pass over the training data (update_bn)
                self.no_grad_batches.append(plain(batch))
            self.bn(batch["a"][0])
            return super().training_step(batch, batch_idx)

    task = WithNorm()
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)
    Trainer(max_epochs=2, callbacks=[swa], **FAST).fit(task, {"a": loader(4, 2), "b": loader(6, 2, 10)})
    assert task.no_grad_batches == [b for _, b in task.seen["train"][:3]]  # one epoch of combined batches


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10.0).view(5, 2))


@pytest.mark.parametrize("limit", [1.0, 3])
def test_a_loader_without_length_in_a_training_dict(limit):
    def run(trainer, task, lightning):
        trainer.fit(task, {"s": DataLoader(Stream(), batch_size=2), "b": loader(4, 1)})
        return trainer.num_training_batches

    (ours, n), (theirs, m) = both(run, max_epochs=2, limit_train_batches=limit)
    assert n == m == (float("inf") if limit == 1.0 else 3)
    assert ours.seen["train"] == theirs.seen["train"] and ours.seen["train"]
    with pytest.raises(ConfigError, match="needs a loader with a length"):
        Trainer(max_epochs=1, limit_train_batches=0.5, **FAST).fit(
            Ours(), {"s": DataLoader(Stream()), "b": loader(4, 1)}
        )


@pytest.mark.parametrize("loaders", [{"a": [0, 1], "b": [2, 3]}, [[0, 1], [2, 3]]], ids=["dict", "list"])
def test_lists_of_numbers_in_a_collection_are_loaders_as_in_lightning(loaders):
    """A dict or list holding lists of numbers is several loaders (a list of numbers is one), never the dict's
    keys as batches."""

    def step(self, batch, batch_idx, dataloader_idx=0):
        return (batch, batch_idx, dataloader_idx)

    class Ours(Task):
        predict_step = step

    class Theirs(pl.LightningModule):
        predict_step = step

    quiet = {k: v for k, v in PL.items() if k != "num_sanity_val_steps"}
    ours = Trainer(**quiet).predict(Ours(), loaders)
    assert (
        ours
        == pl.Trainer(**quiet).predict(Theirs(), loaders)
        == [[(0, 0, 0), (1, 1, 0)], [(2, 0, 1), (3, 1, 1)]]
    )
