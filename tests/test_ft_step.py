"""The fault-tolerant step on a GPU's terms, checked on the CPU with a fake torchft manager (issue 41's rules for
issue 44's code): every tensor fault tolerance builds for a collective across replica groups is made on the
communication device (strategies/comm_device.py's to_comm; a stand-in device makes the check able to fail on
a CPU, tests/helpers/comm_recorder.py), and a steady fault-tolerant DDP step reads no device value on the host
(tests/helpers/host_syncs.py). torchft itself synchronizes the current CUDA stream once per step, in
Manager.should_commit (it must know the step's collectives finished without error before it commits); that
is torchft's and is not counted here (on a CPU there is no stream to wait for)."""

from __future__ import annotations

import datetime
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import DDPStrategy
from strategies.fault_tolerance import FaultTolerance
from strategies.fault_tolerance.averaging import average_across
from strategies.fault_tolerance.transport import SafeTransport
from tests.helpers.comm_recorder import STANDIN, StandInMode
from tests.helpers.host_syncs import HostSyncs
from tests.test_ft_replicas import FakeManager
from trainer import Task, Trainer

START, STEPS = 5, 20  # the steady steps counted


class _Devices:
    """A process group of two ranks in one process that notes the device of every tensor handed to it."""

    def __init__(self) -> None:
        self.queue: list[torch.Tensor] = []
        self.devices: list[torch.device] = []

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        self.devices += [t.device for t in tensors]
        self.queue.append(tensors[0].clone())
        return SimpleNamespace(wait=lambda timeout=None: True)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        self.devices += [t.device for t in tensors]
        tensors[0].copy_(self.queue.pop(0))
        return SimpleNamespace(wait=lambda timeout=None: True)


def test_what_fault_tolerance_hands_a_collective_is_on_the_communication_device():
    timeout = datetime.timedelta(seconds=5)
    with StandInMode():
        pg = _Devices()
        state = {"w": torch.arange(4.0), "loop": {"global_step": 3}}
        SafeTransport(pg, timeout, STANDIN).send_checkpoint([1], step=3, state_dict=state, timeout=timeout)
        got = SafeTransport(pg, timeout, STANDIN).recv_checkpoint(0, "tandem-safe", step=3, timeout=timeout)
        seen: list[torch.device] = []
        manager = FakeManager(participants=2, peer=lambda t: torch.full_like(t, 3.0))
        manager.device = STANDIN
        original = manager.allreduce_sum
        manager.allreduce_sum = lambda t: (seen.append(t.device), original(t))[1]  # type: ignore[method-assign]
        grads = [torch.ones(2), torch.full((3,), 5.0, dtype=torch.float64)]  # (the model's, on its device)
        average_across(manager, grads)  # type: ignore[arg-type]
    assert pg.devices == [STANDIN] * 4, pg.devices  # size and bytes, sent and received
    assert torch.equal(got["w"], torch.arange(4.0)) and got["loop"] == {"global_step": 3}
    assert seen == [STANDIN, STANDIN], seen  # one flat sum per dtype
    assert torch.equal(grads[0], torch.full((2,), 3.5)) and torch.equal(
        grads[1], torch.full((3,), 5.5).double()
    )


class _Net(Task):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.lin(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Arm(Callback):
    def __init__(self, syncs: HostSyncs) -> None:
        self.syncs = syncs

    def on_train_batch_start(self, trainer: Any, task: Any, batch: Any, batch_idx: int) -> None:
        self.syncs.armed = START <= batch_idx < START + STEPS


def test_a_steady_fault_tolerant_ddp_step_reads_no_device_value_on_the_host(tmp_path):
    ft = FaultTolerance(
        replica_groups=2, replica_group=0, lighthouse="http://127.0.0.1:9", address="127.0.0.1"
    )
    strategy = DDPStrategy(accelerator="cpu", fault_tolerance=ft)
    manager = FakeManager(participants=2, peer=lambda t: t.clone())  # the other group: the same gradients
    strategy.replicas.manager = manager  # type: ignore[union-attr,assignment]
    syncs = HostSyncs(armed=False)
    data = TensorDataset(torch.randn(240, 4), torch.randn(240, 1))
    trainer = Trainer(
        strategy=strategy, devices=1, max_epochs=1, log_every_n_steps=50, logger=False,
        callbacks=[_Arm(syncs)], enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    with syncs:
        trainer.fit(_Net(), DataLoader(data, batch_size=4))
    steps = 240 // 2 // 4  # this group's share: half the data
    assert trainer.global_step == steps and manager.commits == steps, (trainer.global_step, manager.commits)
    assert manager.quorums == steps  # the one at the start of fit serves step 1, then one a step
    assert syncs.count == 0, dict(syncs.where)
