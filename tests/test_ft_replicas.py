"""strategies/fault_tolerance/ without a lighthouse: the commit gating and the counts of Replicas with a fake
manager, a rejoining group refused for another model or a lost position, the averaging across groups (the
Reducer's buckets in order, the same sum as one group of all ranks), the plain-data transport, and a rejoin
from a live state equal to an uninterrupted run (trainer/checkpoint/live.py)."""

from __future__ import annotations

import functools
import io
import pickle
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from strategies.fault_tolerance import FaultTolerance
from strategies.fault_tolerance.averaging import CrossGroup, average_across
from strategies.fault_tolerance.replicas import Replicas, fault_tolerant_step
from strategies.fault_tolerance.shards import load_optimizer, load_weights, to_local
from strategies.fault_tolerance.transport import SafeTransport
from strategies.reducer import Reducer
from tandem_core.errors import ConfigError, FaultToleranceError
from tests.conftest import FAST
from tests.helpers.ft_manager import ManagerState
from trainer import Task, Trainer, seed_everything
from trainer.checkpoint.live import LiveState


class FakeManager(ManagerState):
    """What Replicas asks of ReplicaManager; `decisions` are the commits to give, `peer` another group's sum."""

    def __init__(self, participants: int = 2, decisions: list[bool] | None = None, peer: Any = None) -> None:
        self.participants, self.decisions, self.peer = participants, list(decisions or []), peer
        self.quorums = self.commits = 0
        self.errored: BaseException | None = None
        self.order: list[int] = []
        self.transport = SimpleNamespace(received=0)
        self.state = {"step": 0, "batches_committed": 0}
        self.device = torch.device("cpu")  # the communication device of the groups' process group

    def quorum(self) -> None:
        self.quorums += 1

    def commit(self) -> bool:
        self.commits += 1
        return self.decisions.pop(0) if self.decisions else True

    def allreduce_sum(self, tensor: torch.Tensor) -> Any:
        self.order.append(tensor.numel())
        if self.peer is not None:
            tensor.add_(self.peer(tensor))
        return SimpleNamespace(wait=lambda: True)


class FakeLive:
    def __init__(self, task: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.task, self.optimizers, self.micro_batches = task, [optimizer], 2
        self.at = {"epoch": 0, "global_step": 7, "batch_in_epoch": 14}
        self.restored: list[bool] = []

    def snapshot(self, in_loop: bool) -> dict[str, Any]:
        return {"state_dict": self.task.state_dict(), "optimizer_states": [self.optimizers[0].state_dict()]}

    def position(self) -> dict[str, int]:
        return dict(self.at)

    def config(self) -> dict[str, Any]:
        return {"accumulate_grad_batches": self.micro_batches}

    def restore(self, ckpt: dict[str, Any], full: bool, load_states: Any) -> None:
        load_states(ckpt)
        self.restored.append(full)


def _replicas(manager: FakeManager, **options: Any) -> tuple[Replicas, FakeLive]:
    strategy = SimpleNamespace(comm=SimpleNamespace(rank=0, world_size=3), root_device=torch.device("cpu"))
    replicas = Replicas(
        FaultTolerance(replica_groups=2, replica_group=1, lighthouse="http://127.0.0.1:9", **options),
        strategy,
    )
    strategy.replicas = replicas
    task = torch.nn.Linear(3, 2)
    live = FakeLive(task, torch.optim.SGD(task.parameters(), lr=0.1))
    replicas.manager, replicas.live, replicas._in_loop = manager, live, True  # type: ignore[assignment]
    return replicas, live


def test_the_optimizer_steps_only_when_the_manager_commits_and_the_costs_are_counted(capsys):
    manager = FakeManager(participants=1, decisions=[True, False, True])
    replicas, live = _replicas(manager)
    stepped, closures = [], []
    for _ in range(3):
        replicas.begin_step()
        replicas.begin_step()  # a second micro-batch of the window: no second quorum
        fault_tolerant_step(replicas.strategy, lambda opt, closure: stepped.append(closure), live.optimizers[0],
                            lambda: closures.append(1))  # fmt: skip
    assert manager.quorums == 3 and len(closures) == 3 and stepped == [None, None]  # the closure runs first
    c = replicas.costs
    assert (c.committed, c.uncommitted, c.degraded) == (2, 1, 2)
    assert c.skipped_batches == 2 * 1 * 2 * 3  # 2 steps x 1 missing group x 2 micro-batches x 3 ranks
    assert c.dropped_batches == 2 * 3
    assert "not committed (fewer than min_replicas groups): its update is dropped" in capsys.readouterr().err


def test_several_optimizers_of_one_step_share_its_commit():
    manager = FakeManager(decisions=[False])
    replicas, _ = _replicas(manager)
    replicas.begin_step()
    assert [replicas.commit(), replicas.commit()] == [False, False] and manager.commits == 1


def test_consecutive_uncommitted_steps_end_the_run():
    replicas, _ = _replicas(FakeManager(decisions=[False] * 3), max_uncommitted_steps=3)
    for _ in range(2):
        replicas.begin_step()
        replicas.commit()
    replicas.begin_step()
    with pytest.raises(FaultToleranceError, match="3 consecutive steps could not be committed"):
        replicas.commit()


def test_an_optimizer_that_reevaluates_its_closure_is_refused():
    replicas, live = _replicas(FakeManager())
    lbfgs = torch.optim.LBFGS(live.task.parameters())
    with pytest.raises(ConfigError, match="LBFGS, which re-evaluates its closure"):
        fault_tolerant_step(replicas.strategy, None, lbfgs, lambda: None)


def test_a_group_with_another_model_or_config_cannot_join():
    replicas, live = _replicas(FakeManager())
    other, _ = _replicas(FakeManager())
    other.live.task = torch.nn.Linear(3, 4)  # type: ignore[union-attr]
    other.live.micro_batches = 1  # type: ignore[union-attr]
    ckpt = other._send()
    with pytest.raises(
        FaultToleranceError, match=r"trains another model or config.*accumulate_grad_batches: 2 here, 1"
    ):
        replicas._take(ckpt)


def test_a_group_behind_in_its_loop_stops_to_rejoin_at_the_start_of_fit():
    replicas, live = _replicas(FakeManager())
    peer, _ = _replicas(FakeManager())
    peer.live.task.load_state_dict(live.task.state_dict())  # type: ignore[union-attr]
    peer.live.at = {"epoch": 0, "global_step": 9, "batch_in_epoch": 18}  # type: ignore[union-attr]
    with pytest.raises(FaultToleranceError, match="fell behind the live groups"):
        replicas._take(peer._send())
    replicas._in_loop = False  # at the start of fit it takes the live state whole
    with torch.no_grad():
        peer.live.task.weight.add_(1.0)  # type: ignore[union-attr]
    replicas._take(peer._send())
    assert live.restored == [True] and torch.equal(live.task.weight, peer.live.task.weight)  # type: ignore[union-attr]
    assert peer.costs.rejoins == 2  # counted by the live group as it sends (its count travels with the state)


def test_each_group_trains_on_its_own_share_of_a_map_style_loader():
    replicas, _ = _replicas(FakeManager())
    assert replicas.data_shard(2, 3) == (1 * 3 + 2, 2 * 3)
    replicas.check_loader(DataLoader(TensorDataset(torch.zeros(4))))

    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(1)

    with pytest.raises(ConfigError, match="map-style data set.*not a DataLoader over an IterableDataset"):
        replicas.check_loader(DataLoader(Stream()))


class _Work:
    def __init__(self, done: bool) -> None:
        self.done = done

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> bool:
        self.done = True
        return True


def test_the_cross_group_sums_start_in_bucket_order(monkeypatch):
    manager = FakeManager(participants=2)
    works = [_Work(False), _Work(True), _Work(True)]
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: works.pop(0))
    cross = CrossGroup(lambda: manager, None, 3)  # type: ignore[arg-type,return-value]
    assert cross.divisor() == 6
    buckets = [cross.all_reduce(torch.zeros(n)) for n in (1, 2, 3)]
    assert manager.order == []  # bucket 0's in-group sum is not done: none may start before it
    buckets[2].wait()
    assert manager.order == [1, 2, 3]
    one_rank = CrossGroup(lambda: manager, None, 1)  # type: ignore[arg-type,return-value]
    one_rank.all_reduce(torch.zeros(5))
    assert manager.order[-1] == 5  # one rank per group: started at once, overlapping backward


def test_the_reducer_averages_over_the_live_groups_like_one_group_of_all_ranks():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    torch.manual_seed(0)
    model, twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)), None
    twin = [torch.randn_like(p) for p in model.parameters()]
    flat_twin = {}

    def peer(tensor: torch.Tensor) -> torch.Tensor:  # the other group's (divided) bucket: its gradients / 2
        return flat_twin.setdefault(tensor.numel(), tensor.clone() * 0 + _bucket_of(model, twin, tensor) / 2)

    manager = FakeManager(participants=2, peer=peer)
    reducer = Reducer(model, bucket_cap_mb=0.0001, first_bucket_cap_mb=0.0001, rebuild_buckets=False,
                      cross_group=CrossGroup(lambda: manager, None, 1))  # type: ignore[arg-type,return-value]  # fmt: skip
    x = torch.randn(5, 4)
    loss = model(x).square().sum()
    reducer.prepare_for_backward(loss)
    loss.backward()
    reducer.finalize()
    expected = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,)).square().sum())(
        {n: p.detach() for n, p in model.named_parameters()}
    )
    for (n, p), t in zip(model.named_parameters(), twin):
        assert torch.allclose(p.grad, (expected[n] + t) / 2, atol=1e-6), n
    assert len(manager.order) == len(reducer.bucket_indices) > 1  # one sum across groups per bucket


def _bucket_of(model: torch.nn.Module, twin: list[torch.Tensor], tensor: torch.Tensor) -> torch.Tensor:
    """The other group's gradients laid out as the bucket of `tensor`'s size (reverse parameter order)."""
    params = list(model.parameters())
    for start in range(len(params)):
        for end in range(start + 1, len(params) + 1):
            chosen = list(reversed(range(start, end)))
            if sum(params[i].numel() for i in chosen) == tensor.numel():
                return torch.cat([twin[i].reshape(-1) for i in chosen])
    raise AssertionError(tensor.numel())


def test_average_across_divides_by_the_live_groups():
    manager = FakeManager(participants=2, peer=lambda t: torch.full_like(t, 3.0))
    grads = [torch.ones(2), torch.full((3,), 5.0, dtype=torch.float64)]
    average_across(manager, grads)  # type: ignore[arg-type]
    assert torch.equal(grads[0], torch.full((2,), 3.5)) and torch.equal(
        grads[1], torch.full((3,), 5.5, dtype=torch.float64)
    )


class _Pipe:
    """A process group of two ranks in one process: send() queues, recv() takes in order."""

    def __init__(self) -> None:
        self.queue: list[torch.Tensor] = []

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        self.queue.append(tensors[0].clone())
        return SimpleNamespace(wait=lambda timeout=None: True)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        tensors[0].copy_(self.queue.pop(0))
        return SimpleNamespace(wait=lambda timeout=None: True)


def test_the_state_travels_as_plain_data_and_a_payload_is_refused():
    import datetime

    pipe, timeout = _Pipe(), datetime.timedelta(seconds=5)
    sender, receiver = (
        SafeTransport(pipe, timeout, torch.device("cpu")),
        SafeTransport(pipe, timeout, torch.device("cpu")),
    )
    state = {"user": {"default": {"w": torch.arange(3.0), "loop": {"epoch": 2}}}, "torchft": {"step": 4}}
    sender.send_checkpoint([1], step=4, state_dict=state, timeout=timeout)
    got = receiver.recv_checkpoint(0, "tandem-safe", step=4, timeout=timeout)
    assert torch.equal(got["user"]["default"]["w"], torch.arange(3.0)) and got["torchft"] == {"step": 4}
    sender.send_checkpoint([1], step=5, state_dict={"hook": functools.partial(print, "ran")}, timeout=timeout)
    with pytest.raises(pickle.UnpicklingError):
        receiver.recv_checkpoint(0, "tandem-safe", step=5, timeout=timeout)
    assert isinstance(receiver.failure, pickle.UnpicklingError)
    buf = io.BytesIO()  # the control: torch's full unpickler would have run it
    torch.save({"hook": functools.partial(print, "ran")}, buf)
    assert callable(torch.load(io.BytesIO(buf.getvalue()), weights_only=False)["hook"])


def test_weights_and_optimizer_states_load_in_place():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    oa, ob = torch.optim.Adam(a.parameters()), torch.optim.Adam(b.parameters())
    a(torch.ones(1, 2)).sum().backward()
    oa.step()
    weight = b.weight
    load_weights(b, to_local(a.state_dict()))
    load_optimizer(ob, to_local(oa.state_dict()))
    assert b.weight is weight and torch.equal(b.weight, a.weight)
    assert torch.equal(ob.state_dict()["state"][0]["exp_avg"], oa.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(KeyError, match="missing"):
        load_weights(
            torch.nn.Linear(2, 2, bias=False), {"weight": torch.zeros(2, 2), "other": torch.zeros(1)}
        )


# ----- rejoin = an exact resume from a live peer's state (the trainer's side, no torchft) -----------------
class _Net(Task):
    def __init__(self, take_at: int = -1) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
        self.take_at, self.taken = take_at, None

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == self.take_at and self.taken is None:  # where a quorum hands it over
            buf = io.BytesIO()  # as SafeTransport sends it: a copy, read back as plain data only
            torch.save(to_local(LiveState(self.trainer).snapshot(in_loop=True)), buf)
            self.taken = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.05)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g)),
                          batch_size=4, shuffle=True)  # fmt: skip


class _Join:
    """A strategy's `replicas` whose first quorum hands over `ckpt` (what Replicas does when behind)."""

    def __init__(self, ckpt: dict[str, Any]) -> None:
        self.ckpt = ckpt

    def join(self, live: LiveState) -> None:
        def states(ckpt: dict[str, Any]) -> None:
            load_weights(live.task, ckpt["state_dict"])
            for opt, st in zip(live.optimizers, ckpt["optimizer_states"]):
                load_optimizer(opt, st)

        live.restore(self.ckpt, full=True, load_states=states)


@pytest.mark.parametrize("take_at", [13, 20], ids=["mid-epoch", "epoch-start"])
def test_a_group_taking_a_live_state_trains_on_exactly_as_the_live_group(take_at):
    seed_everything(0)
    live = _Net(take_at)
    Trainer(max_epochs=3, deterministic=True, **FAST).fit(live)  # 10 batches an epoch
    assert live.taken is not None and live.taken["global_step"] == take_at
    seed_everything(5)  # another start: the live state must decide everything that follows
    joining = _Net()
    trainer = Trainer(max_epochs=3, deterministic=True, **FAST)
    trainer.strategy.replicas = _Join(live.taken)  # type: ignore[attr-defined]
    starts = []
    joining.on_train_batch_start = lambda batch, i: starts.append((trainer.global_step, i))  # type: ignore[method-assign]
    trainer.fit(joining)
    assert starts[0] == (take_at, take_at % 10) and trainer.global_step == 30
    for (n, a), b in zip(live.state_dict().items(), joining.state_dict().values()):
        assert torch.equal(a, b), n


def test_with_no_live_group_ahead_a_group_keeps_what_its_checkpoint_restored():
    replicas, live = _replicas(FakeManager())
    manager, replicas.manager = replicas.manager, None
    ckpt_state = {"manager": {"step": 40, "batches_committed": 80}, "costs": {"committed": 40, "degraded": 3}}
    replicas.load_state_dict(ckpt_state)  # the checkpoint's strategy state, restored before fit's loop
    replicas.manager = manager  # (built at the start of fit: join() builds it when there is none)
    replicas.join(live)  # type: ignore[arg-type]
    assert manager.state == {"step": 40, "batches_committed": 80} and manager.quorums == 1  # type: ignore[union-attr]
    assert live.restored == [] and replicas.costs.committed == 40 and replicas.costs.degraded == 3
    assert replicas.state_dict() == {"manager": manager.state, "costs": {**vars(replicas.costs)}}  # type: ignore[union-attr]
