"""Ctrl-C at a chosen batch of fit/validate/test/predict, the same script under Lightning and under Tandem
(tests/test_ctrl_c.py, tests/test_ctrl_c_ddp.py). Every callback hook, the DataModule's on_exception and the
steps are recorded with a summary of their arguments.

python ctrl_c.py FRAMEWORK STAGE AT MODE DEVICES OUT
    FRAMEWORK  tandem | lightning
    STAGE      fit | validate | test | predict
    AT         the batch whose on_<stage>_batch_end sends SIGINT, counted from 0 over the stage (in fit over both
               epochs); -1: none, an uninterrupted run
    MODE       inside: the process sends SIGINT to itself (os.kill(os.getpid(), SIGINT)), on every rank;
               group: rank 0 sends SIGINT to the process group the job was started in (a terminal's Ctrl-C);
               under Tandem it then waits until the signal has reached it (see `_arrives`)
    DEVICES    1, or 2 (ddp on two CPU processes)
    OUT        a directory: each rank writes hooks-rank<R>.json (its record, its exit) when it exits

The job's first process puts its process group id in CTRL_C_GROUP, which every process it starts inherits.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
    "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
    "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_save_checkpoint", "on_exception",
)  # fmt: skip
PREFIX = {"fit": "train", "validate": "validation", "test": "test", "predict": "predict"}  # the batch hooks
CHECKPOINT_HOOKS = ("state_dict", "on_save_checkpoint")  # what saving a checkpoint calls on a callback


def summary(value: Any) -> Any:
    """An argument as the record keeps it: plain values as they are, an exception by its class (and its
    KeyboardInterrupt-ness), anything else by its kind."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, BaseException):
        return f"exception:{type(value).__name__}:keyboard_interrupt={isinstance(value, KeyboardInterrupt)}"
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, torch.optim.Optimizer):
        return "optimizer"
    return "object"


class Squares(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


def _arrives(trainer: Any) -> None:
    """Wait (at most 30 s) until the SIGINT sent to the group has reached this process. Under Tandem's launcher
    the group holds the launcher, not the workers (torch starts them in sessions of their own), and the
    launcher passes the SIGINT on a moment later; waiting for it here makes it arrive during this batch, as a
    terminal's Ctrl-C reaches Lightning's rank 0 (in the group) inside this hook. The other rank gets it
    whenever the launcher's SIGINT reaches it: before or after the ranks have agreed to stop."""
    deadline = time.monotonic() + 30
    while trainer.state.stop_signal is None and time.monotonic() < deadline:
        time.sleep(0.005)


def build(framework: str, stage: str, at: int, mode: str, devices: int, out: str) -> tuple[Any, ...]:
    """(trainer, task, datamodule, record, ended) of the framework: `record` collects the hooks, `ended` what
    the run saw when it stopped; checkpoints go under `out`."""
    # A process started in the background of a non-interactive shell (`cmd &`, as a CI step or nohup may start the
    # tests) inherits SIGINT ignored, and Python then leaves it ignored: Lightning, which relies on Python's
    # handler, would never see the Ctrl-C. The comparison is about a Ctrl-C that reaches the process.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if framework == "lightning":
        import pytorch_lightning as pl

        callback_base, task_base, dm_base, trainer_cls = (
            pl.Callback,
            pl.LightningModule,
            pl.LightningDataModule,
            pl.Trainer,
        )
    else:
        from callbacks import Callback
        from trainer import DataModule, Task, Trainer

        callback_base, task_base, dm_base, trainer_cls = Callback, Task, DataModule, Trainer
    record: list[list[Any]] = []
    ended: dict[str, Any] = {}

    def hook(name: str) -> Any:
        def fn(self: Any, trainer: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
            record.append(
                [name, [summary(a) for a in args], {k: summary(v) for k, v in sorted(kwargs.items())}]
            )
            if name == "on_exception":
                ended["step_at_exception"] = int(trainer.global_step)
                ended["weights_at_exception"] = float(sum(p.double().sum() for p in module.parameters()))
            if name == f"on_{PREFIX[stage]}_batch_end" and sum(r[0] == name for r in record) == at + 1:
                ended["interrupted_at"] = [name, int(trainer.global_step)]
                if mode == "inside":
                    os.kill(os.getpid(), signal.SIGINT)
                elif trainer.global_rank == 0:
                    os.killpg(int(os.environ["CTRL_C_GROUP"]), signal.SIGINT)
                    if framework == "tandem":  # (Lightning's rank 0 is in the group: interrupted right here)
                        _arrives(trainer)

        fn.__name__ = name
        return fn

    def state_dict(self: Any) -> dict[str, Any]:
        record.append(["state_dict", [], {}])
        return {}

    recorder = type("Recorder", (callback_base,), {"state_dict": state_dict, **{n: hook(n) for n in HOOKS}})

    class Task(task_base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            record.append(["training_step", [batch_idx], {}])
            return self.layer(batch).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            record.append(["validation_step", [batch_idx], {}])
            self.log("val_loss", self.layer(batch).pow(2).mean(), sync_dist=True)

        def test_step(self, batch: Any, batch_idx: int) -> Any:
            record.append(["test_step", [batch_idx], {}])
            self.log("test_loss", self.layer(batch).pow(2).mean(), sync_dist=True)

        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            record.append(["predict_step", [batch_idx], {}])
            return self.layer(batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(dm_base):  # type: ignore[misc,valid-type]
        def train_dataloader(self) -> Any:
            return DataLoader(Squares(64), batch_size=4)

        def val_dataloader(self) -> Any:
            return DataLoader(Squares(32), batch_size=4)

        def test_dataloader(self) -> Any:
            return DataLoader(Squares(32), batch_size=4)

        def predict_dataloader(self) -> Any:
            return DataLoader(Squares(32), batch_size=4)

        def on_exception(self, exception: BaseException) -> None:
            record.append(["datamodule.on_exception", [summary(exception)], {}])

    torch.manual_seed(0)  # the same initial weights in both frameworks
    task = Task()
    trainer = trainer_cls(
        max_epochs=2,
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        callbacks=[recorder()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=os.path.join(out, "root"),
    )
    return trainer, task, Data(), record, ended


def compare(lightning: list[Any], tandem: list[Any], uninterrupted: Any, stage: str) -> list[Any]:
    """Check Tandem's record of an interrupted run against Lightning's. Both end in the callbacks' and the
    DataModule's on_exception with a KeyboardInterrupt; before the hook that sent the signal they agree hook
    for hook. Lightning stops inside that hook; Tandem finishes the batch and stops where the ranks agree (the
    next step boundary or evaluation batch): the hooks between are those of a run that is not interrupted
    (`uninterrupted()`: Lightning's record of one), then, in fit, the checkpoint at the stop (state_dict,
    on_save_checkpoint) and nothing else. Returns the hooks Tandem ran after Lightning stopped."""
    interrupt = "exception:KeyboardInterrupt:keyboard_interrupt=True"
    ends = [["on_exception", [interrupt], {}], ["datamodule.on_exception", [interrupt], {}]]
    assert lightning[-2:] == ends, lightning[-4:]
    assert tandem[-2:] == ends, tandem[-4:]
    n = len(lightning) - 2
    assert tandem[:n] == lightning[:n], next(
        (i, a, b) for i, (a, b) in enumerate(zip(tandem, lightning)) if a != b
    )
    middle = tandem[n:-2]
    k = next((i for i, h in enumerate(middle) if h[0] in CHECKPOINT_HOOKS), len(middle))
    if k:
        assert middle[:k] == uninterrupted()[n : n + k], (middle[:k], uninterrupted()[n : n + k])
    saved = middle[k:]
    assert all(h[0] in CHECKPOINT_HOOKS for h in saved), saved
    assert bool(saved) == (stage == "fit"), (
        saved
    )  # fit checkpoints at the stop; the other stages save nothing
    return middle


def main(argv: list[str]) -> None:
    framework, stage, at, mode, devices, out = argv[0], argv[1], int(argv[2]), argv[3], int(argv[4]), argv[5]
    os.environ.setdefault("CTRL_C_GROUP", str(os.getpgid(0)))
    if framework == "tandem":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    # Tandem's launcher: a process of its own that starts the workers (each has RANK) and runs no hook
    launcher = framework == "tandem" and devices > 1 and "RANK" not in os.environ
    trainer, task, data, record, ended = build(framework, stage, at, mode, devices, out)

    def write() -> None:  # at exit, however the run ends (SystemExit, an interrupt, a normal end)
        if launcher:  # (its empty record must not replace rank 0's)
            return
        rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
        path = os.path.join(out, f"hooks-rank{rank}.json")
        with open(path + ".part", "w") as f:  # whole or absent: Lightning's rank 0 SIGKILLs the other ranks
            json.dump({"record": record, **ended}, f)
        os.replace(path + ".part", path)

    atexit.register(write)
    try:
        getattr(trainer, stage)(task, datamodule=data)
    except SystemExit as e:
        ended["exit"] = e.code
        who = "the launcher" if launcher else f"rank {trainer.global_rank}"
        print(f"{who} exits with {e.code}", file=sys.stderr, flush=True)
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
