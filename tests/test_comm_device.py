"""Every tensor handed to a collective is on the strategy's communication device (issue 41, findings 1, 2, 8).

One spawn of 2 gloo ranks fits every process-group strategy (ddp with bucket_cap_mb="auto" through a trial,
find_unused_parameters, sync_batchnorm and clipping; ddp with accumulation on an iterable loader; ddp_zero1;
fsdp; model_parallel with clipping over mixed meshes; pipeline) with the communication device forced to a
stand-in ("meta" holding data, tests/helpers/comm_recorder.py), while every logging path runs: self.log with
sync_dist of Python numbers, CPU tensors, the loss and a Metric, on_step and on_epoch, in training and in
validation, and self.all_gather of a CPU tensor. A recorder of torch.distributed's collectives lists every
tensor that is not where it must be; the call sites it saw prove each path ran. (strategy='dp' is one process:
it has no collectives.) At the end, the groups close as at exit with none left referenced. Unit checks: the comm device per backend, barrier's device_ids under NCCL, NCCL's
error handling set before its group is made, NCCL's failures as DistributedErrors, the chunked broadcast.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from tests.conftest import FAST, run_distributed
from trainer import Task, Trainer


class LogTask(Task):
    """Logs through every sync_dist path; with `unused`, `spare` is used at even steps only."""

    def __init__(self, bn: bool = False, unused: bool = False) -> None:
        super().__init__()
        self.unused = unused
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16) if bn else nn.Identity(), nn.Tanh())
        self.head, self.spare = nn.Linear(16, 3), nn.Linear(8, 3)
        self.mean = torchmetrics.MeanMetric()
        self.gathered: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.head(self.net(x))
        if not (self.unused and batch_idx % 2):
            out = out + self.spare(x)
        loss = F.cross_entropy(out, y)
        self.log("loss", loss, sync_dist=True, on_step=True, on_epoch=True)
        self.log("number", 1.0 + self.global_rank, sync_dist=True, on_step=True, on_epoch=True)
        self.log("cpu_max", torch.tensor(float(batch_idx)), sync_dist=True, on_epoch=True, reduce_fx="max")
        self.log("cpu_sum", torch.tensor(2.0), sync_dist=True, on_step=True, on_epoch=False, reduce_fx="sum")
        self.mean(loss.detach())
        self.log("metric", self.mean, sync_dist=True, on_step=True, on_epoch=True)
        self.gathered.append(self.all_gather(torch.tensor([float(batch_idx)])))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.head(self.net(x)), y), sync_dist=True)
        self.log("val_number", 3, sync_dist=True)
        self.log("val_cpu", torch.tensor(1.0), sync_dist=True, reduce_fx="sum", on_step=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Stream(IterableDataset):
    """Batches of unknown number (5 per rank: the last accumulation window is cut short)."""

    def __iter__(self):
        g = torch.Generator().manual_seed(1)
        for _ in range(5):
            yield torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)


def _data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g))


def _fits(rank: int, world: int, force: bool) -> dict:
    """Every strategy's fit under the recorder; with `force`, on the stand-in communication device."""
    from helpers.comm_recorder import STANDIN, Recorder, StandInMode, force_comm_device

    import strategies.autotune as autotune
    from strategies.ddp import DDPStrategy
    from strategies.fsdp import FSDPStrategy
    from strategies.model_parallel import ModelParallelStrategy
    from strategies.pipeline import PipelineStrategy
    from tests.scripts.mp_train import MPTask, make_data
    from tests.test_pipeline import PipeNet
    from tests.test_pipeline import data as pipe_data

    # the autotuner's trial (and its decision broadcast) only runs when the cost model picks other buckets;
    # short probes and trial: this test is about where tensors are, not about what is measured
    autotune.choose_buckets = lambda ready, sizes, order, *a, **k: [[i] for i in order]
    autotune.TRIAL_ITERATIONS, autotune.TRIAL_WINS, autotune.PROBE_REPEATS = 2, 1, 1
    autotune.PROBE_BYTES = (4096, 65536)
    recorder = Recorder()
    _count_host_reads(recorder.sites)
    undo = force_comm_device(STANDIN) if force else (lambda: None)
    recorder.install()
    mode = StandInMode() if force else None
    if force:  # autograd runs backward functions without the caller's torch-function modes: enter it there
        import strategies.syncbn as syncbn

        backward = syncbn._SumAcrossRanks.backward

        def in_mode(ctx, grad):
            with StandInMode():
                return backward(ctx, grad)

        syncbn._SumAcrossRanks.backward = staticmethod(in_mode)
    runs = [
        (
            "ddp auto+unused+syncbn+clip",
            lambda: Trainer(
                strategy=DDPStrategy(bucket_cap_mb="auto", find_unused_parameters=True),
                sync_batchnorm=True,
                gradient_clip_val=0.5,
                max_steps=8,
                limit_val_batches=2,
                **FAST,
                devices=world,
            ),
            lambda t: t.fit(
                LogTask(bn=True, unused=True),
                DataLoader(_data(), batch_size=2),
                DataLoader(_data(8), batch_size=2),
            ),
        ),
        (
            "ddp accumulate on an iterable loader",
            lambda: Trainer(
                strategy="ddp",
                accumulate_grad_batches=2,
                max_epochs=1,
                devices=world,
                use_distributed_sampler=False,
                **FAST,
            ),
            lambda t: t.fit(LogTask(), DataLoader(Stream(), batch_size=None)),
        ),
        (
            "ddp_zero1",
            lambda: Trainer(strategy="ddp_zero1", max_steps=3, devices=world, **FAST),
            lambda t: t.fit(LogTask(), DataLoader(_data(), batch_size=4)),
        ),
        (
            "fsdp",
            lambda: Trainer(strategy=FSDPStrategy(), max_steps=3, limit_val_batches=1, devices=world, **FAST),
            lambda t: t.fit(LogTask(), DataLoader(_data(), batch_size=4), DataLoader(_data(8), batch_size=4)),
        ),
        (
            "model_parallel (1, 2) with clipping",
            lambda: Trainer(
                strategy=ModelParallelStrategy(1, 2),
                max_steps=3,
                gradient_clip_val=0.05,
                precision="64-true",
                devices=world,
                **FAST,
            ),
            lambda t: t.fit(MPTask("mlp"), DataLoader(make_data(), batch_size=8)),
        ),
        (
            "pipeline",
            lambda: Trainer(
                strategy=PipelineStrategy(), max_steps=2, precision="64-true", devices=world, **FAST
            ),
            lambda t: t.fit(PipeNet(2), DataLoader(pipe_data(), batch_size=12)),
        ),
    ]
    try:
        for label, make, fit in runs:
            recorder.label = label
            if mode is not None:
                mode.__enter__()
            try:
                recorder.trainer = trainer = make()
                fit(trainer)
            finally:
                if mode is not None:
                    mode.__exit__(None, None, None)
            if label.startswith("ddp accumulate"):  # the data ending inside a window whose backward skipped
                strategy = trainer.strategy  # sync (the loop's agreed last batch syncs): averaged in one go
                for p in strategy.reducer.params:
                    p.grad = torch.full_like(p, float(rank))
                strategy._unsynced = True
                with mode if mode is not None else contextlib.nullcontext():
                    strategy.unscale_gradients(trainer.optimizers[0])
                averaged = all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in strategy.reducer.params)
                recorder.sites["averaged"] += int(averaged)
            if label.startswith("ddp auto"):
                auto = trainer.strategy.reducer.auto
                recorder.sites["trial ran"] += int(auto is not None and auto.sync_s_trial is not None)
    finally:
        recorder.uninstall()
        undo()
    from strategies import group_exit

    # what the interpreter's exit does, with the last trainer (the pipeline's) still alive: every group closes
    # and none stays referenced (ddp_zero1's ZeRO module and the pipeline's stages held theirs)
    held = group_exit.close_groups()
    return {"violations": recorder.violations, "sites": dict(recorder.sites), "held": held}


def _count_host_reads(sites) -> None:
    """Count what the step path reads back on the host where it must not (on a GPU each is a sync): in
    gradient clipping over mixed meshes any .cpu()/.item()/.tolist(); in the Reducer's finalize (with
    find_unused_parameters) any of them on a tensor off the host. Also counts the calls, to prove they ran."""
    from torch.overrides import TorchFunctionMode

    import strategies.clipping as clipping
    from strategies.reducer import Reducer

    reads = (torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist)

    class Reads(TorchFunctionMode):
        def __init__(self, key: str, off_host_only: bool) -> None:
            super().__init__()
            self.key, self.off_host_only = key, off_host_only

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in reads and not (self.off_host_only and args[0].device.type == "cpu"):
                sites[self.key] += 1
            return func(*args, **(kwargs or {}))

    def watched(fn, key: str, off_host_only: bool):
        def run(*args, **kwargs):
            sites[f"{key} calls"] += 1
            with Reads(f"{key} host reads", off_host_only):
                return fn(*args, **kwargs)

        return run

    clipping.clip_grad_norm = watched(clipping.clip_grad_norm, "clip_grad_norm", False)
    Reducer.finalize = watched(Reducer.finalize, "finalize", True)


# every path that must have handed a tensor to a collective (file:function collective)
EXPECTED_SITES = (
    "strategies/comm.py:run all_reduce",  # comm.reduce: sync_dist of every kind, agreements
    "strategies/comm.py:run all_gather",  # comm.all_gather: self.all_gather of a CPU tensor
    "strategies/autotune.py:_verdict broadcast",  # the autotuner's decision (finding 2)
    "strategies/autotune.py:plan broadcast",
    "strategies/comm_device.py:_broadcast_chunk broadcast",  # the Reducer's first broadcast, sync_buffers
    "strategies/unused.py:start all_reduce",  # find_unused_parameters' agreement
    "strategies/ddp.py:_average_grads_now all_reduce",  # a cut-short accumulation window
    "strategies/syncbn.py:forward all_reduce",
    "strategies/reducer.py:_launch_ready all_reduce",
    "trial ran",
    "averaged",
)


@pytest.fixture(scope="module")
def forced() -> list[dict]:
    return run_distributed(_fits, True, timeout=300.0)


def test_every_collective_gets_its_tensors_on_the_communication_device(forced):
    for rank, result in enumerate(forced):
        sites = result["sites"]
        # clipping over mixed meshes (model_parallel's run) and finalize (ddp's) ran, reading nothing back
        assert sites.get("clip_grad_norm calls") and not sites.get("clip_grad_norm host reads"), sites
        assert sites.get("finalize calls") and not sites.get("finalize host reads"), sites
        assert result["held"] == 0, "closed process groups still referenced at exit"
        assert not result["violations"], f"rank {rank}:\n" + "\n".join(result["violations"])
        missing = [s for s in EXPECTED_SITES if not result["sites"].get(s)]
        assert not missing, f"rank {rank}: paths not exercised: {missing}; saw {sorted(result['sites'])}"


def test_comm_device_follows_the_backend(monkeypatch):
    from strategies import comm_device as cd

    for backend, root, expected in [
        ("gloo", None, "cpu"),
        ("gloo", torch.device("cuda", 1), "cpu"),
        ("nccl", torch.device("cuda", 1), "cuda:1"),
        ("cpu:gloo,cuda:nccl", torch.device("cuda", 0), "cuda:0"),
        ("cpu:gloo,cuda:nccl", None, "cpu"),
    ]:
        monkeypatch.setattr(cd.dist, "get_backend", lambda group=None, b=backend: b)
        assert cd.comm_device(None, root) == torch.device(expected), backend
    monkeypatch.setattr(cd.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(cd.torch.cuda, "current_device", lambda: 3)
    assert cd.comm_device() == torch.device("cuda", 3)  # no root: the current CUDA device


def test_barrier_names_the_device_under_nccl_only(monkeypatch):
    from strategies import comm_device as cd

    calls: list[dict] = []
    monkeypatch.setattr(cd.dist, "barrier", lambda **kw: calls.append(kw))
    for backend in ("nccl", "gloo"):
        monkeypatch.setattr(cd.dist, "get_backend", lambda group=None, b=backend: b)
        cd.barrier(torch.device("cuda", 2))
    cd.barrier(torch.device("cpu"))
    assert calls == [{"group": None, "device_ids": [2]}, {"group": None}, {"group": None}]


def test_to_comm_copies_only_when_asked_or_moving():
    from strategies.comm_device import to_comm

    t = torch.tensor([1.0, 2.0])
    assert (
        to_comm(t, torch.device("cpu")) is not None
        and to_comm(t, torch.device("cpu")).data_ptr() == t.data_ptr()
    )
    assert to_comm(t, torch.device("cpu"), copy=True).data_ptr() != t.data_ptr()
    assert torch.equal(to_comm([1, 2], torch.device("cpu"), torch.int64), torch.tensor([1, 2]))
    assert to_comm(3.5, torch.device("cpu")).item() == 3.5


def test_broadcast_tensors_sends_chunks_of_at_most_the_cap(monkeypatch):
    from strategies import comm_device as cd

    sent: list[tuple[int, torch.dtype, bool]] = []
    tensors = [torch.full((n,), float(n)) for n in (10, 20, 300, 5)] + [torch.ones(7, dtype=torch.int64)]
    big = tensors[2]

    def fake(t, src, group=None):
        sent.append((t.numel(), t.dtype, t.data_ptr() == big.data_ptr()))
        t.mul_(2)  # what rank 0 would send: every value doubled

    monkeypatch.setattr(cd.dist, "broadcast", fake)
    cd.broadcast_tensors(tensors, 0, None, torch.device("cpu"), chunk_bytes=4 * 100)
    # 10 + 20 floats fit in 400 bytes; 300 floats alone (in place); 5 floats; the int64 tensor on its own
    assert sent == [
        (30, torch.float32, False),
        (300, torch.float32, True),
        (5, torch.float32, False),
        (7, torch.int64, False),
    ]
    for t, n in zip(tensors, (10, 20, 300, 5)):
        assert torch.equal(t, torch.full((n,), 2.0 * n))


def test_nccl_group_is_made_with_async_error_handling_and_the_timeout(monkeypatch):
    import strategies.process_group as pg
    from strategies.ddp import DDPStrategy

    made: dict = {}
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.setattr(pg.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        pg.dist,
        "init_process_group",
        lambda backend, **kw: made.update(backend=backend, env=dict(os.environ), **kw),
    )
    monkeypatch.setattr(pg, "comm_device", lambda group=None, root=None: torch.device("cpu"))
    s = DDPStrategy(accelerator="cpu", process_group_backend="nccl", timeout_s=42, devices=1)
    s._group_of_one()
    s._join_group()
    assert made["backend"] == "nccl" and made["timeout"] == datetime.timedelta(seconds=42)
    assert made["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # the user's choice is kept
    s._join_group()
    assert made["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


@pytest.mark.parametrize(
    "text,says",
    [
        (
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=60000) ran for 60012 milliseconds before timing out.",
            "did not complete within timeout_s",
        ),
        (
            "NCCL communicator was aborted on rank 0. Original reason for failure was: [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=3, OpType=BROADCAST) ran for 1800031 milliseconds",
            "did not complete within timeout_s",
        ),
        (
            "NCCL error in: ProcessGroupNCCL.cpp:1996, remote process exited or there was a network error, NCCL "
            "version 2.21.5; ncclRemoteError: A call failed possibly due to a network error or a remote process "
            "exiting prematurely.",
            "was lost",
        ),
    ],
)
def test_nccl_failures_become_distributed_errors(text, says):
    from strategies.comm import ProcessGroupComm
    from tandem_core.errors import DistributedError

    error = ProcessGroupComm().translate("gradient all-reduce", dist.DistBackendError(text))
    assert isinstance(error, DistributedError) and says in str(error) and "gradient all-reduce" in str(error)


def test_unused_parameters_agree_on_the_group_itself_under_gloo_and_on_a_gloo_group_under_nccl(monkeypatch):
    from strategies import unused

    made: list[dict] = []
    monkeypatch.setattr(
        unused.dist, "new_group", lambda ranks, **kw: made.append(dict(ranks=ranks, **kw)) or "gloo-group"
    )
    monkeypatch.setattr(unused.dist, "get_world_size", lambda group=None: 2)
    assert unused.UsedParameters(3, "the group", torch.device("cpu")).group == "the group" and made == []
    used = unused.UsedParameters(3, None, torch.device("cuda", 0))
    assert used.group == "gloo-group"
    assert made == [{"ranks": [0, 1], "backend": "gloo", "use_local_synchronization": True}]
    used.release()
    assert used.group is None  # (at exit, before the groups close)
