"""A replica group's first quorum (strategies/fault_tolerance/replicas.py Replicas.join, trainer/checkpoint/
live.py): which group's state wins when groups that went back to their own checkpoints meet a live group or each
other, and that the state handed over is the one the sender trains from.

The lab test's failure ("the groups' weights or RNG differ at global steps [176, ...]", reproduced in the lab:
both groups killed at step 199 resumed from their checkpoints at steps 175 and 75, met in one first quorum,
and group 1 took group 0's state): a group resumed from its checkpoint file holds that checkpoint's RNG
unapplied until its loop starts, and sent the RNG of the moment instead; the taker's dropout then drew other
masks from the first step on (`test_a_group_resumed_from_its_checkpoint_hands_over_the_state_it_trains_from`).

A second way to two histories, found by reading torchft: it heals a group only when the count of committed
steps it reports is below the quorum's highest, and takes equal counts for equal states. After both groups
restarted, the one back first trains alone and can reach, with other weights, exactly the count the other's
checkpoint holds: torchft then heals neither. Here the quorum is torchft's rule (src/manager.rs
compute_quorum_results, restated in `heal_source`) over the counts the groups report, the groups meet at a
barrier as their requests meet at the lighthouse, and the ordering of the race is forced: no sleeps, no
lighthouse process. The same race against torchft's own lighthouse and managers: the slow test at the end."""

from __future__ import annotations

import importlib.util
import io
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import strategies.fault_tolerance.replicas as replicas_module
from strategies.fault_tolerance import FaultTolerance
from strategies.fault_tolerance.replicas import Replicas, starting_step
from strategies.fault_tolerance.shards import to_local
from tandem_core.errors import FaultToleranceError
from tests.helpers.ft_manager import ManagerState


def heal_source(steps: dict[str, int], me: str, group_rank: int = 0) -> str | None:
    """The group `me` heals from in a quorum where each group reported `steps` (None: it keeps its state), by
    torchft 0.2's rule: groups below the highest step heal from one at it, spread by rank; at step 0 (init_sync)
    every group but the rank's primary heals."""
    ids = sorted(steps)
    top = max(steps.values())
    at_top = [i for i in ids if steps[i] == top]
    primary = at_top[group_rank % len(at_top)]
    recovering = [i for i in ids if steps[i] != top or (top == 0 and i != primary)]
    up_to_date = [i for i in ids if i not in recovering]
    for n, i in enumerate(recovering):
        if i == me:
            return up_to_date[(n + group_rank) % len(up_to_date)]
    return None


class Lighthouse:
    """One quorum of `size` groups: each group's manager reports its step and waits for the others (a barrier,
    as the requests wait at the lighthouse); a source sends a plain-data copy of its state to each group that
    heals from it, as torchft's quorum thread does."""

    def __init__(self, size: int, group_rank: int = 0) -> None:
        self.barrier, self.group_rank = threading.Barrier(size), group_rank
        self.reports: dict[str, int] = {}
        self.boxes: dict[str, queue.Queue[Any]] = {}


class Manager(ManagerState):
    """What Replicas asks of ReplicaManager, its quorum decided by `heal_source` among the lighthouse's groups."""

    def __init__(self, name: str, step: int = 0) -> None:
        self.name, self.state = name, {"step": step, "batches_committed": 2 * step}
        self.lighthouse: Lighthouse | None = None
        self.participants, self.errored, self.fail_heal = 1, None, False
        self.transport = SimpleNamespace(received=0)
        self.replicas: Replicas | None = None
        self.reported: list[int] = []

    def quorum(self) -> None:
        lh, me = self.lighthouse, self.name
        assert lh is not None and self.replicas is not None
        self.errored = None
        self.reported.append(self.state["step"])
        lh.reports[me] = self.state["step"]
        lh.boxes.setdefault(me, queue.Queue())
        lh.barrier.wait(timeout=30)  # every group has asked: the quorum forms
        steps = dict(lh.reports)
        self.participants = len(steps)
        for dst in [g for g in steps if heal_source(steps, g, lh.group_rank) == me]:
            buf = io.BytesIO()  # what SafeTransport sends: torch.save, read back with weights_only=True
            torch.save(to_local(self.replicas._send()), buf)
            lh.boxes.setdefault(dst, queue.Queue()).put(buf.getvalue())
        if heal_source(steps, me, lh.group_rank) is not None:
            got = torch.load(io.BytesIO(lh.boxes[me].get(timeout=30)), weights_only=True)
            if self.fail_heal:  # torchft logs a failed transfer and marks the step errored
                self.errored = RuntimeError("recv_checkpoint timed out")
                return
            self.state["step"] = max(steps.values())  # torchft's own, before the state is applied
            self.replicas._take(got)

    def commit(self) -> bool:
        if self.errored is not None:
            return False
        self.state["step"] += 1
        return True


class Live:
    """A group's training state as the trainer hands it (trainer/checkpoint/live.py): weights, loop position,
    and the strategy's state, which carries the manager's count (restored with the rest, as a checkpoint's)."""

    def __init__(self, replicas: Replicas, fill: float, global_step: int) -> None:
        self.replicas, self.micro_batches = replicas, 1
        self.task = torch.nn.Linear(3, 2)
        with torch.no_grad():
            for p in self.task.parameters():
                p.fill_(fill)
        self.optimizers = [torch.optim.SGD(self.task.parameters(), lr=0.1)]
        self.at = {"epoch": 0, "global_step": global_step, "batch_in_epoch": global_step}

    def snapshot(self, in_loop: bool) -> dict[str, Any]:
        return {
            "state_dict": self.task.state_dict(),
            "optimizer_states": [o.state_dict() for o in self.optimizers],
            "loop": dict(self.at),
            "strategy": {"fault_tolerance": self.replicas.state_dict()},
        }

    def position(self) -> dict[str, int]:
        return dict(self.at)

    def config(self) -> dict[str, Any]:
        return {"accumulate_grad_batches": 1}

    def restore(self, ckpt: dict[str, Any], full: bool, load_states: Any) -> None:
        load_states(ckpt)
        self.replicas.load_state_dict(ckpt["strategy"]["fault_tolerance"])  # as restore_training does
        if full:
            self.at = dict(ckpt["loop"])


def _group(group: int, fill: float, global_step: int, count: int, live: bool) -> tuple[Replicas, Live]:
    """Group `group` of two: trained `count` committed steps to `global_step` with weights `fill`; `live`: in
    its loop (its manager built and counting), else resumed from its checkpoint and about to join."""
    strategy = SimpleNamespace(comm=SimpleNamespace(rank=0, world_size=1))
    replicas = Replicas(
        FaultTolerance(replica_groups=2, replica_group=group, lighthouse="http://127.0.0.1:9"), strategy
    )
    state = Live(replicas, fill, global_step)
    manager = Manager(f"tandem_group_{group}")
    manager.replicas, replicas.manager = replicas, manager  # type: ignore[assignment]
    if live:
        manager.state = {"step": count, "batches_committed": 2 * count}
        replicas.live, replicas._in_loop = state, True  # type: ignore[assignment]
    else:  # the checkpoint's strategy state, restored before fit's loop
        replicas.manager = None
        replicas.load_state_dict({"manager": {"step": count, "batches_committed": 2 * count}})
        replicas.manager = manager  # type: ignore[assignment]
    return replicas, state


def _meet(lighthouse: Lighthouse, *calls: tuple[Replicas, Callable[[], None]]) -> None:
    """Each group's call in its own thread, all in one quorum of `lighthouse`; the first error raised."""
    for replicas, _ in calls:
        replicas.manager.lighthouse = lighthouse  # type: ignore[union-attr]
    with ThreadPoolExecutor(len(calls)) as pool:
        for future in [pool.submit(call) for _, call in calls]:
            future.result(timeout=60)


def _join(replicas: Replicas, live: Live) -> tuple[Replicas, Callable[[], None]]:
    return replicas, lambda: replicas.join(live)  # type: ignore[arg-type]


def _step(replicas: Replicas) -> tuple[Replicas, Callable[[], None]]:
    return replicas, replicas.begin_step


def _weights(live: Live) -> list[torch.Tensor]:
    return [p.detach().clone() for p in live.task.parameters()]


def _race() -> tuple[Replicas, Live, Replicas, Live]:
    """Both groups were killed at once and went back to their own checkpoints: group 1 to global step 150 (150
    committed steps), group 0 to 175 (168 committed: 7 steps in between were dropped during failures). Group 1
    came back first and trained alone, 18 steps, each committed: global step 168, 168 committed steps, which
    is the count group 0's checkpoint holds. Now group 0 joins, in the quorum of group 1's next step."""
    r1, l1 = _group(1, fill=1.0, global_step=168, count=168, live=True)
    r0, l0 = _group(0, fill=2.0, global_step=175, count=168, live=False)
    _meet(Lighthouse(2), _join(r0, l0), _step(r1))
    return r0, l0, r1, l1


def test_a_group_back_from_its_checkpoint_takes_the_live_state_at_an_equal_count(capsys):
    r0, l0, r1, l1 = _race()
    for a, b in zip(_weights(l0), _weights(l1)):
        assert torch.equal(a, b)
    assert l0.at == l1.at == {"epoch": 0, "global_step": 168, "batch_in_epoch": 168}
    assert r0.manager.reported[0] < 0 < r1.manager.reported[0] == 168  # type: ignore[union-attr]
    assert r0.manager.state == r1.manager.state == {"step": 168, "batches_committed": 336}  # type: ignore[union-attr]
    assert r0.costs == r1.costs and r0._own is None
    err = capsys.readouterr().err
    assert "replica group 0: rejoined from a live replica group at global step 168" in err
    assert "own checkpoint was 7 step(s) further, in a history the live group does not share" in err
    assert r0.commit() and r1.commit() and r0.manager.state == r1.manager.state  # type: ignore[union-attr]


def test_the_control_reporting_the_checkpoints_count_leaves_two_histories(monkeypatch):
    """The same race with the count the checkpoint holds reported (the code before the fix): torchft heals
    neither group, which go on with other weights at other global steps while averaging their gradients."""
    monkeypatch.setattr(replicas_module, "starting_step", lambda committed, group, groups: committed)
    r0, l0, r1, l1 = _race()
    assert r0.manager.reported == r1.manager.reported == [168]  # type: ignore[union-attr]
    assert not torch.equal(_weights(l0)[0], _weights(l1)[0]) and l0.at != l1.at


@pytest.mark.parametrize("group_rank", [0, 1])
@pytest.mark.parametrize("counts", [(168, 143), (143, 168), (168, 168)], ids=["0-ahead", "1-ahead", "tie"])
def test_groups_starting_together_take_the_state_of_the_one_with_the_most_committed_steps(counts, group_rank):
    """Every rank of a group takes the same group's state: at a tie torchft spreads the sources over the ranks
    (rank 1 of group 0 would take group 1's state while rank 0 keeps group 0's), and at a tie of two counts
    above 0 it heals neither (the control)."""
    r0, l0 = _group(0, fill=2.0, global_step=counts[0] + 7, count=counts[0], live=False)
    r1, l1 = _group(1, fill=1.0, global_step=counts[1] + 7, count=counts[1], live=False)
    _meet(Lighthouse(2, group_rank), _join(r0, l0), _join(r1, l1))
    winner = 1 if counts[1] > counts[0] else 0
    for a, b in zip(_weights(l0), _weights(l1)):
        assert torch.equal(a, b) and float(a.flatten()[0]) == (1.0 if winner else 2.0)
    assert l0.at == l1.at and l0.at["global_step"] == counts[winner] + 7
    own = {"step": counts[winner], "batches_committed": 2 * counts[winner]}
    assert r0.manager.state == r1.manager.state == own  # type: ignore[union-attr]
    if counts[0] == counts[1]:
        steps = {"tandem_group_0": counts[0], "tandem_group_1": counts[1]}
        assert heal_source(steps, "tandem_group_0", group_rank) is None
        assert heal_source(steps, "tandem_group_1", group_rank) is None


def test_the_starting_steps_rank_below_every_live_count_and_never_tie():
    reports = [starting_step(c, g, 3) for c in range(50) for g in range(3)]
    assert len(set(reports)) == 150 and max(reports) < 0
    assert starting_step(5, 2, 3) > starting_step(4, 0, 3) and starting_step(5, 0, 3) > starting_step(5, 1, 3)


def test_a_group_alone_keeps_its_checkpoint_and_after_a_failed_heal_stays_below_the_live_groups():
    r0, l0 = _group(0, fill=2.0, global_step=175, count=168, live=False)
    _meet(Lighthouse(1), _join(r0, l0))
    assert r0.manager.state == {"step": 168, "batches_committed": 336} and l0.at["global_step"] == 175  # type: ignore[union-attr]
    # a heal that fails (the transfer timed out): the group reports below the live groups on, its checkpoints
    # hold its own count, and its step is not committed
    r1, l1 = _group(1, fill=1.0, global_step=168, count=168, live=True)
    r2, l2 = _group(0, fill=2.0, global_step=175, count=168, live=False)
    r2.manager.fail_heal = True  # type: ignore[union-attr]
    _meet(Lighthouse(2), _join(r2, l2), _step(r1))
    assert r2.manager.state["step"] < 0 and not r2.commit()  # type: ignore[union-attr]
    assert r2.state_dict()["manager"] == {"step": 168, "batches_committed": 336}
    assert r1.commit()
    # the next quorum heals it from the live group, which is at another position: it stops to rejoin
    r2.manager.fail_heal = False  # type: ignore[union-attr]
    with pytest.raises(FaultToleranceError, match="replica group 0 fell behind the live groups"):
        _meet(Lighthouse(2), _step(r2), _step(r1))


class _Source:
    """A strategy's `replicas` whose first quorum sends this group's state (what Replicas._send hands torchft
    when a joining group takes it), as the transport carries it: a copy read back as plain data."""

    sent: dict[str, Any] | None = None

    def join(self, live: Any) -> None:
        buf = io.BytesIO()
        torch.save(to_local(live.snapshot(in_loop=False)), buf)
        self.sent = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)


@pytest.mark.filterwarnings("ignore:the checkpoint holds the state of callbacks")
def test_a_group_resumed_from_its_checkpoint_hands_over_the_state_it_trains_from(tmp_path):
    """Both groups killed at once, both back in one first quorum: the group that keeps its checkpoint's state
    sends it before its loop starts, when the checkpoint's RNG (and a window's gradients, a combined loader's
    position) are read but applied only as the loop starts. The joining group must train on exactly as the
    sender (dropout draws from the RNG every step): before the fix it took the sender's RNG of that moment."""
    from callbacks import ModelCheckpoint
    from tests.conftest import FAST
    from tests.test_ft_replicas import _Join, _Net
    from trainer import Trainer, seed_everything

    seed_everything(0)
    reference = _Net()
    last = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=13, save_last=True, save_top_k=0)
    Trainer(max_epochs=3, deterministic=True, callbacks=[last], **{**FAST, "enable_checkpointing": True}).fit(
        reference
    )  # last.ckpt: step 26
    seed_everything(1)  # a restarted process: another RNG until the checkpoint's is applied
    sender, source = _Net(), _Source()
    trainer = Trainer(max_epochs=3, deterministic=True, **FAST)
    trainer.strategy.replicas = source  # type: ignore[attr-defined]
    trainer.fit(sender, ckpt_path=str(tmp_path / "last.ckpt"))
    assert source.sent is not None and source.sent["global_step"] == 26
    seed_everything(5)
    joining = _Net()
    trainer = Trainer(max_epochs=3, deterministic=True, **FAST)
    trainer.strategy.replicas = _Join(source.sent)  # type: ignore[attr-defined]
    starts: list[tuple[int, int]] = []
    joining.on_train_batch_start = lambda batch, i: starts.append((trainer.global_step, i))  # type: ignore[method-assign]
    trainer.fit(joining)
    assert starts[0] == (26, 6) and trainer.global_step == 30
    for (n, ref), s, j in zip(
        reference.state_dict().items(), sender.state_dict().values(), joining.state_dict().values()
    ):
        assert torch.equal(ref, s), n  # (the sender resumed exactly)
        assert torch.equal(s, j), n


needs_torchft = pytest.mark.skipif(
    importlib.util.find_spec("torchft") is None,
    reason="needs the fault-tolerance extra (make test-slow installs it)",
)


@pytest.mark.slow  # (seconds, but it needs the extra, which make test-slow installs)
@needs_torchft
def test_the_race_against_torchfts_own_lighthouse_and_managers():
    """`_race` with torchft deciding: a lighthouse in this process, each group's real ReplicaManager (torchft's
    Manager, its process group and Tandem's transport). Group 1 joins alone and is live at 168 committed steps;
    group 0, from a checkpoint of another history with the same count, joins in the quorum of one of group 1's
    next steps (group 1 asks for quorums, committing nothing, until a quorum holds both)."""
    from strategies.fault_tolerance.manager import require_torchft

    require_torchft()
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=100, quorum_tick_ms=50)
    url = f"http://127.0.0.1:{server.address().rsplit(':', 1)[1]}"
    groups = []
    try:
        for group, fill, at in ((1, 1.0, 168), (0, 2.0, 175)):
            comm = SimpleNamespace(
                rank=0, world_size=1, device=torch.device("cpu"), broadcast=lambda obj: obj
            )
            options = FaultTolerance(replica_groups=2, replica_group=group, lighthouse=url, timeout_s=20,
                                     quorum_timeout_s=30)  # fmt: skip
            replicas = Replicas(options, SimpleNamespace(comm=comm))
            replicas.load_state_dict({"manager": {"step": 168, "batches_committed": 336}})  # its checkpoint's
            groups.append((replicas, Live(replicas, fill, at)))
        (r1, l1), (r0, l0) = groups
        r1.join(l1)  # type: ignore[arg-type]
        assert r1.manager.participants == 1 and r1.manager.step == 168  # type: ignore[union-attr]
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(r0.join, l0)  # type: ignore[arg-type]
            for _ in range(600):  # (each quorum of group 1 alone takes one lighthouse tick)
                r1._open = False
                r1.begin_step()
                if r1.manager.participants == 2:  # type: ignore[union-attr]
                    break
            joined.result(timeout=60)
        for a, b in zip(_weights(l0), _weights(l1)):
            assert torch.equal(a, b)
        assert l0.at == l1.at and r0.manager.step == r1.manager.step == 168  # type: ignore[union-attr]
    finally:
        for replicas, _ in groups:
            replicas.shutdown()
        server.shutdown()
