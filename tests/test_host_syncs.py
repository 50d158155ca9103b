"""No host read of a device value in a steady-state training step (issue 41): on a GPU each one stops the host from
running ahead and leaves the GPU idle through the next step's Python and data loading.

Counted with tests/helpers/host_syncs.py (calls of .item/.tolist/.cpu/.numpy, bool/int/float of a tensor, and
torch.tensor/as_tensor with a device) over 30 steady-state steps (batches 10 to 39) with a logger whose
interval does not fall among them and the task logging its loss. Per step, at 07a338b (before) and now:

    strategy                          before  now
    single                              0.0   0.0
    ddp, 1 process                      2.0   0.0   (the stop agreement: a tensor built on the device, .item())
    ddp, 2 processes                    2.0   0.0
    ddp, 2 processes, IterableDataset   6.0   0.0   (and the per-batch join: two more of each)
    fsdp, 2 processes                   2.0   0.0
    model_parallel, 2 processes         2.0   0.0

The agreements now run pipelined (strategies/agreement.py): started without waiting, answered LAG calls later
from host memory. The spawn also checks what that must keep: a stop signal on one rank stops every rank at the
same step (LAG agreements later), and an IterableDataset of uneven length per rank ends the epoch on every rank
after the shortest rank's last batch, with `last` seen at that batch.
"""

from __future__ import annotations

import signal
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from callbacks import Callback
from strategies.agreement import LAG
from tests.conftest import run_distributed
from tests.helpers.host_syncs import HostSyncs
from trainer import Task, Trainer
from trainer.loggers import CSVLogger

START, STEPS = 10, 30  # the steps counted: batches 10..39 (no logging step among them: log_every_n_steps=50)


class _Arm(Callback):
    """Counts host syncs between the start of batch START and the start of batch START + STEPS."""

    def __init__(self, syncs: HostSyncs) -> None:
        self.syncs = syncs

    def on_train_batch_start(self, trainer: Any, task: Any, batch: Any, batch_idx: int) -> None:
        self.syncs.armed = START <= batch_idx < START + STEPS


class _Net(Task):
    def __init__(self, shard: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.shard = torch.nn.Linear(4, 1), shard
        self.seen: list[tuple[int, int]] = []  # (batch_idx, global_step) of each training batch

    def configure_model(self) -> None:
        if self.shard:  # ModelParallelStrategy: the task shards itself on the mesh it is given
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.lin, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.lin(x), y)
        self.log("loss", loss, prog_bar=True)
        self.seen.append((batch_idx, self.global_step))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Stream(IterableDataset):
    """`n` samples, no length: the loop cannot know where it ends."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(self.n)
        for _ in range(self.n):
            yield torch.randn(4, generator=g), torch.randn(1, generator=g)


def _fit(
    strategy: Any, tmp: str, data: Any = None, devices: int = 1, callbacks: tuple = ()
) -> tuple[float, Any]:
    """Host syncs per counted step, and the task."""
    syncs = HostSyncs(armed=False)
    task = _Net(shard=type(strategy).__name__ == "ModelParallelStrategy")
    data = (
        data
        if data is not None
        else TensorDataset(torch.randn(240 * devices, 4), torch.randn(240 * devices, 1))
    )
    trainer = Trainer(
        strategy=strategy, devices=devices, accelerator="cpu", max_epochs=1, log_every_n_steps=50,
        logger=CSVLogger(tmp), callbacks=[_Arm(syncs), *callbacks], enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    with syncs:
        trainer.fit(task, DataLoader(data, batch_size=4))
    return syncs.count / STEPS, dict(syncs.where)


def test_no_host_sync_in_a_steady_step_of_one_process(tmp_path):
    for strategy in ("single", "ddp"):  # ddp at one process: the process-group path with its agreements
        per_step, where = _fit(strategy, str(tmp_path / strategy))
        assert per_step == 0, (strategy, where)


class _SignalAt(Callback):
    """A SIGTERM arrives on rank 1 alone during batch `at` (as the handler records it)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer: Any, task: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank == 1 and batch_idx == self.at:
            trainer.state.stop_signal = signal.SIGTERM


def _two_ranks(rank: int, world: int, tmp: str) -> dict[str, Any]:
    from strategies import DDPStrategy, FSDPStrategy
    from strategies.model_parallel import ModelParallelStrategy

    out: dict[str, Any] = {}
    for name, make in (
        ("ddp", lambda: DDPStrategy(accelerator="cpu")),
        ("fsdp", lambda: FSDPStrategy(accelerator="cpu")),
        ("model_parallel", lambda: ModelParallelStrategy(2, 1)),
    ):
        out[name] = _fit(make(), f"{tmp}/{name}{rank}", devices=world)[0]
    # uneven iterable data: rank 0 has 60 batches, rank 1 has 45
    stream = _Stream(240 if rank == 0 else 180)
    last: list[int] = []

    class _Last(Callback):
        def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
            last.append(trainer.state.batch_in_epoch)

    out["stream"], _ = _fit(DDPStrategy(accelerator="cpu"), f"{tmp}/s{rank}", stream, world, (_Last(),))
    out["stream_batches"] = last
    # a stop signal on rank 1 during batch 20: every rank stops after the same step
    task_steps: list[int] = []

    class _Steps(Callback):
        def on_train_batch_end(
            self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            task_steps.append(trainer.global_step)

    try:
        _fit(
            DDPStrategy(accelerator="cpu"),
            f"{tmp}/t{rank}",
            devices=world,
            callbacks=(_SignalAt(20), _Steps()),
        )
        out["stopped_with"] = None
    except SystemExit as e:
        out["stopped_with"] = e.code
    out["last_step"] = task_steps[-1]
    return out


def test_no_host_sync_in_a_steady_step_of_two_processes(tmp_path):
    """ddp, fsdp, model_parallel and ddp over an IterableDataset at 2 ranks (one spawn), and what the pipelined
    agreements keep: every rank ends uneven data and stops on a signal at the same step."""
    ranks = run_distributed(_two_ranks, str(tmp_path), timeout=300)
    for r, out in enumerate(ranks):
        for name in ("ddp", "fsdp", "model_parallel", "stream"):
            assert out[name] == 0, (r, name, out[name])
        assert out["stream_batches"] == [45], (r, out["stream_batches"])  # the shorter rank's 45 batches
        assert out["stopped_with"] == 128 + signal.SIGTERM
        # the signal arrived during batch 20 (global step 20 before it, 21 after): agreed LAG steps later
        assert out["last_step"] == 21 + LAG, (r, out["last_step"])
