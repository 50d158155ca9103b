"""A tiny task, data module and callback that config tests name in ``_target_`` entries, and `base()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import DataModule, Task

HERE = __name__  # the import path of this module, whatever pytest's import mode made it


class TinyTask(Task):
    """A linear regressor: enough to build, fit a few steps and checkpoint."""

    def __init__(self, width: int = 4, lr: float = 0.1, head: Any = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="head")
        self.net = torch.nn.Linear(width, 1)
        self.head = head

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class TinyData(DataModule):
    def __init__(self, n: int = 16, width: int = 4, batch_size: int = 4) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(n, width, generator=g), torch.randn(n, 1, generator=g))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


class Counter(Callback):
    def __init__(self, label: str = "c") -> None:
        self.label, self.steps = label, 0

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps += 1


class NeedsN(TinyTask):
    """A task with a required argument."""

    def __init__(self, n: int) -> None:
        super().__init__(width=n)


BUILT: list[str] = []  # what Recorder built: tests that check a command builds nothing look here


class Recorder(TinyTask):
    """A TinyTask that records each construction."""

    def __init__(self, lr: float = 0.1) -> None:
        BUILT.append(type(self).__name__)
        super().__init__(lr=lr)


class TypedTask(Task):
    """A task whose arguments are annotated: what nested _target_ entries may build for each of them."""

    def __init__(
        self,
        backbone: torch.nn.Module | None = None,
        make_opt: Callable[..., torch.optim.Optimizer] | None = None,
        loss_fn: Callable | None = None,
        blocks: list[torch.nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.backbone, self.make_opt, self.loss_fn, self.blocks = backbone, make_opt, loss_fn, blocks


class SGDFactory:
    """A class whose instances build an optimizer: its __call__ says so, so a Callable[..., Optimizer] takes it."""

    def __init__(self, lr: float = 0.1) -> None:
        self.lr = lr

    def __call__(self, params: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr)


class HeadsTask(TinyTask):
    """A TinyTask whose `head` is a mapping of optimizer factories (or lists of ints)."""

    def __init__(
        self, width: int = 4, head: dict[str, Callable[..., torch.optim.Optimizer] | list[int]] | None = None
    ) -> None:
        super().__init__(width=width, head=head)


def base(tmp_path: Any = None, **trainer: Any) -> dict[str, Any]:
    """A quiet config of TinyTask on TinyData for 2 steps; `trainer` keywords go to its trainer section."""
    quiet = dict(
        logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False
    )
    root = {"default_root_dir": str(tmp_path)} if tmp_path is not None else {}
    return {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "max_steps": 2, **quiet, **root, **trainer},
        "task": {"_target_": f"{HERE}.TinyTask", "lr": 0.1},
        "data": {"_target_": f"{HERE}.TinyData"},
    }
