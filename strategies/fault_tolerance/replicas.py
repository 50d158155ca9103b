"""One replica group's part in a fault-tolerant job, as DDPStrategy and FSDPStrategy drive it: the first
quorum at the start of fit (a restarted group takes a live peer's state there), one quorum per optimizer
step, the optimizer step only when the manager commits it, each group reading its own share of the data,
and what a failure cost, counted and said in the logs."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from strategies.fault_tolerance.options import FaultTolerance, Resolved
from strategies.fault_tolerance.shards import load_optimizer, load_weights
from tandem_core.errors import ConfigError, FaultToleranceError

if TYPE_CHECKING:
    from strategies.fault_tolerance.manager import ReplicaManager

#: below any count of committed steps a live group reports (torchft counts them from 0)
_STARTING = -(2**62)


def starting_step(committed: int, group: int, groups: int) -> int:
    """The step a group reports at its first quorum (see Replicas.join): below every live group's, and among
    groups that are starting too, ordered by the committed steps their checkpoints hold, then by the lower
    group index, so that no two starting groups report the same."""
    return _STARTING + committed * groups + (groups - 1 - group)


class LiveState(Protocol):
    """What the trainer gives (trainer/checkpoint/live.py): the run's state as a checkpoint dict in memory."""

    task: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    micro_batches: int

    def snapshot(self, in_loop: bool) -> dict[str, Any]: ...
    def position(self) -> dict[str, int]: ...
    def config(self) -> dict[str, Any]: ...
    def restore(self, ckpt: dict[str, Any], full: bool, load_states: Any) -> None: ...


@dataclass
class Costs:
    """What failures cost the job so far, as counted by the groups that lived through them (a rejoining
    group takes the live group's counts). Batches are loader batches of one rank."""

    committed: int = 0  # optimizer steps committed by this group
    uncommitted: int = 0  # steps whose update was dropped (a collective failed, or too few groups)
    degraded: int = 0  # steps committed by fewer than all replica groups (averaged over the live ones)
    skipped_batches: int = 0  # batches the missing groups' shares held at those steps: never trained on
    dropped_batches: int = 0  # batches of the uncommitted steps (this group's)
    rejoins: int = 0  # times a live group sent its state to a group behind it (not the first quorum's)


class Replicas:
    """The fault-tolerance side of a strategy; `strategy` gives comm, the device and the process group."""

    def __init__(self, options: FaultTolerance, strategy: Any) -> None:
        self.options, self.strategy = options, strategy
        self.r: Resolved | None = None
        self.manager: ReplicaManager | None = None
        self.live: LiveState | None = None
        self.costs = Costs()
        self._loaded: dict[str, Any] | None = None  # the manager's state from a checkpoint, until it exists
        self._own: dict[str, Any] | None = None  # this group's own manager state while it joins (see join)
        self._open = False  # a quorum was joined for the step under way
        self._decision: bool | None = None  # this step's commit (several optimizers: asked once)
        self._in_loop = False
        self._participants: int | None = None
        self._since_commit = 0
        self.overhead_s, self._steps = 0.0, 0  # time in the per-step quorum and commit, and the steps timed

    # ----- set-up --------------------------------------------------------------------------------
    def resolve(self) -> Resolved:
        if self.r is None:
            self.r = self.options.resolved()
        return self.r

    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        """(rank, world) of this process among every group's: each group trains on its own share."""
        r = self.resolve()
        return r.replica_group * world + rank, r.replica_groups * world

    def check_loader(self, loader: Any) -> None:
        """A training loader each group can take its share of by index, of the same length in every group."""
        from torch.utils.data import DataLoader, IterableDataset

        if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
            raise ConfigError(
                f"fault tolerance needs a torch DataLoader over a map-style data set for training, not a "
                f"{type(loader).__name__}{' over an IterableDataset' if isinstance(loader, DataLoader) else ''}: "
                "each replica group reads its own share through a distributed sampler, so that every group "
                "ends each epoch at the same step and a rejoining group can skip to the live groups' position"
            )

    def join(self, live: LiveState) -> None:
        """Start of fit: build the manager, join the first quorum (taking a live peer's state when behind)."""
        from strategies.fault_tolerance.manager import ReplicaManager

        r, comm = self.resolve(), self.strategy.comm
        self.live = live
        if self.manager is None:
            self.manager = ReplicaManager(
                r,
                comm.rank,
                comm.world_size,
                comm.device,  # the communication device (strategies/comm_device.py)
                comm.broadcast,
                self._send,
                self._take,
            )
        # torchft heals a group only when its count of committed steps is below the quorum's highest: it
        # takes equal counts for equal states. A group starting from its own checkpoint (or from scratch) can
        # break that: after every group restarted at once, each went back to its own checkpoint, and the one
        # back first, training alone, reaches the other's count with other weights at another global step. So
        # until its first quorum is over a starting group reports a count below every live group's: it takes
        # a live group's state whatever its checkpoint holds; in a quorum of starting groups only, the one
        # whose checkpoint holds the most committed steps (the lowest group index on a tie) keeps its state
        # and every rank of the others takes it.
        own = self._loaded if self._loaded is not None else self.manager.state_dict()
        self._loaded, self._own = None, dict(own)
        r = self.resolve()
        self.manager.load_state_dict(
            {**own, "step": starting_step(int(own["step"]), r.replica_group, r.replica_groups)}
        )
        self._in_loop = False
        self._quorum()
        self._in_loop = True

    @property
    def committed(self) -> bool | None:
        """Whether the last optimizer step was committed (None before the first)."""
        return self._decision

    # ----- every step ----------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before a step's first forward: join this step's quorum (once per optimizer step)."""
        if not self._open:
            self._quorum()

    def commit(self) -> bool:
        """After backward: whether the optimizer may step (every group that took part agreed)."""
        if self._decision is not None:
            return self._decision
        assert self.manager is not None and self.live is not None
        errored = self.manager.errored
        started = time.perf_counter()
        decision = self._decision = self.manager.commit()
        self.overhead_s += time.perf_counter() - started
        self._open = False
        per_step = self.live.micro_batches * self.strategy.comm.world_size
        if decision:
            self.costs.committed += 1
            self._since_commit = 0
            missing = self.resolve().replica_groups - self.manager.participants
            if missing > 0:
                self.costs.degraded += 1
                self.costs.skipped_batches += missing * per_step
        else:
            self.costs.uncommitted += 1
            self.costs.dropped_batches += per_step
            self._since_commit += 1
            reason = (
                f"{type(errored).__name__}: {_short(errored)}"
                if errored
                else "fewer than min_replicas groups"
            )
            self._say(
                f"step at global step {self.live.position()['global_step']} not committed ({reason}): its update "
                f"is dropped ({self.costs.uncommitted} so far)"
            )
            if self._since_commit >= self.options.max_uncommitted_steps:
                raise FaultToleranceError(
                    f"replica group {self.resolve().replica_group}: {self._since_commit} consecutive steps could "
                    f"not be committed (max_uncommitted_steps={self.options.max_uncommitted_steps}; last: "
                    f"{reason}); the replica groups cannot train together"
                )
        return decision

    def _quorum(self) -> None:
        assert self.manager is not None and self.live is not None
        started = time.perf_counter()
        self.manager.quorum()
        if self._own is not None and self.manager.errored is None:  # joined, keeping its own state:
            self.manager.load_state_dict(self._own)  # its own count again (a failed heal keeps it below)
            self._own = None
        if self._in_loop:  # (the first quorum waits for the groups to start: not a per-step cost)
            self.overhead_s += time.perf_counter() - started
            self._steps += 1
        self._open, self._decision = True, None
        participants, groups = self.manager.participants, self.resolve().replica_groups
        if participants != self._participants:
            step = self.live.position()["global_step"]
            if participants < groups:
                self._say(
                    f"{participants} of {groups} replica groups in the quorum at global step {step}: "
                    f"gradients are averaged over the live groups and the missing groups' shares of the "
                    f"data are skipped until they rejoin"
                )
            elif self._participants is not None:
                self._say(f"all {groups} replica groups in the quorum again at global step {step}")
            self._participants = participants

    # ----- the state a live group sends, and its taking ---------------------------------------------
    def _send(self) -> dict[str, Any]:
        """torchft's state_dict callback (its quorum thread; this group's main thread waits in the quorum)."""
        assert self.live is not None
        if self.live.position()["global_step"] > 0:  # (not the first quorum's init sync) counted here, so
            self.costs.rejoins += 1  # that the state sent carries it and both groups count alike
        ckpt = self.live.snapshot(self._in_loop)
        ckpt["fault_tolerance"] = {"config": self._fingerprint(), "position": self.live.position()}
        return ckpt

    def _take(self, ckpt: dict[str, Any]) -> None:
        """torchft's load_state_dict callback: this group is behind a live one; take its state."""
        assert self.live is not None
        ours, theirs = self._fingerprint(), ckpt.get("fault_tolerance", {}).get("config", {})
        differ = [k for k in sorted({*ours, *theirs}) if ours.get(k) != theirs.get(k)]
        if differ:
            shown = "; ".join(
                f"{k}: {_brief(ours.get(k))} here, {_brief(theirs.get(k))} in the live group"
                for k in differ[:4]
            )
            raise FaultToleranceError(
                f"replica group {self.resolve().replica_group} cannot join: it trains another model or config "
                f"than the live replica group ({shown}). Start every replica group with the same code, script "
                "and config."
            )
        theirs_at, ours_at = ckpt["fault_tolerance"]["position"], self.live.position()
        if self._in_loop and theirs_at != ours_at:
            raise FaultToleranceError(
                f"replica group {self.resolve().replica_group} fell behind the live groups (here {ours_at}, there "
                f"{theirs_at}) and cannot take their state between two steps; it stops so that its launcher "
                "restarts it (torchrun --max-restarts), and it rejoins from a live peer at the start of fit"
            )
        started = time.monotonic()
        self._own = None  # the live group's count comes with its state (the strategy's state restores it)
        self.live.restore(ckpt, full=not self._in_loop, load_states=self._load_states)
        took, size = time.monotonic() - started, self.manager.transport.received / 1e6  # type: ignore[union-attr]
        if theirs_at["global_step"] == 0 and not self._in_loop:  # the first quorum of the job (init sync)
            self._say(f"took a live replica group's initial weights and state ({size:.1f} MB) before step 1")
            return
        where = "rejoined" if not self._in_loop else "healed in place"
        back = ours_at["global_step"] - theirs_at["global_step"]
        self._say(
            f"{where} from a live replica group at global step {theirs_at['global_step']} (epoch "
            f"{theirs_at['epoch']}, batch {theirs_at['batch_in_epoch']} of the epoch): weights, optimizer, "
            f"loop position, RNG and the loader's position taken over ({size:.1f} MB, applied in "
            f"{took:.2f}s); so far {self.costs.degraded} steps ran without some group, skipping "
            f"{self.costs.skipped_batches} batches of the missing groups' shares"
            + (
                f"; this group's own checkpoint was {back} step(s) further, in a history the live group "
                "does not share: those steps are dropped"
                if back > 0
                else ""
            )
        )

    def _load_states(self, ckpt: dict[str, Any]) -> None:
        assert self.live is not None
        try:
            load_weights(self.live.task, ckpt["state_dict"])
        except (KeyError, RuntimeError) as e:
            raise FaultToleranceError(f"the live group's weights do not fit this task: {e}") from e
        for opt, state in zip(self.live.optimizers, ckpt["optimizer_states"]):
            load_optimizer(opt, state)

    def _fingerprint(self) -> dict[str, Any]:
        assert self.live is not None
        s = self.strategy
        params = [(n, tuple(_local_shape(p)), str(p.dtype)) for n, p in self.live.task.named_parameters()]
        return {
            **self.live.config(),
            "parameters": repr(params),
            "strategy": f"{type(s).__name__}({', '.join(f'{k}={getattr(s, k)!r}' for k in _KNOBS if hasattr(s, k))})",
            "ranks per replica group": s.comm.world_size,
            "replica_groups": self.resolve().replica_groups,
        }

    # ----- checkpoints and the end -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._own is not None:  # joining: the count it reports to the lighthouse is not its own
            manager: dict[str, Any] | None = dict(self._own)
        else:
            manager = self.manager.state_dict() if self.manager is not None else self._loaded
        return {"manager": manager, "costs": asdict(self.costs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("costs"):
            self.costs = Costs(**state["costs"])
        if state.get("manager") is not None:
            if self.manager is not None:
                self.manager.load_state_dict(state["manager"])
            else:
                self._loaded = dict(state["manager"])

    def shutdown(self) -> None:
        if self.manager is None:
            return
        c = self.costs
        per_step = (
            f"; quorum and commit: {1e3 * self.overhead_s / self._steps:.1f} ms a step on average"
            if self._steps
            else ""
        )
        self._say(
            f"done: {c.committed} steps committed, {c.uncommitted} dropped ({c.dropped_batches} batches), "
            f"{c.degraded} at a smaller world size ({c.skipped_batches} batches of missing groups skipped), "
            f"{c.rejoins} rejoin(s) from a live peer{per_step}"
        )
        self.manager.shutdown()
        self.manager, self.live, self._open, self._in_loop, self._own = None, None, False, False, None

    def _say(self, text: str) -> None:
        if self.strategy.comm.rank == 0:
            group = self.r.replica_group if self.r is not None else "?"
            print(f"[tandem] fault tolerance: replica group {group}: {text}", file=sys.stderr, flush=True)


_KNOBS = ("bucket_cap_mb", "comm_hook", "zero", "reshard_after_forward", "wrap", "min_params")


def _local_shape(p: torch.Tensor) -> torch.Size:
    local = getattr(p, "to_local", None)
    return local().shape if callable(local) else p.shape


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:200]


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def fault_tolerant_step(
    strategy: Any, step: Any, optimizer: torch.optim.Optimizer, closure: Any, **kwargs: Any
) -> Any:
    """The optimizer step under fault tolerance: the closure first (forward, backward, the averaging across
    groups), then `step(optimizer, None, **kwargs)` (the strategy's own) only when the manager commits."""
    from strategies.precision import needs_closure

    if needs_closure(optimizer):
        raise ConfigError(
            f"fault tolerance cannot run {type(optimizer).__name__}, which re-evaluates its closure: a step is "
            "committed or dropped after its one forward and backward; use an optimizer that steps once per batch"
        )
    result = closure() if closure is not None else None
    if strategy.replicas.commit():
        step(optimizer, None, **kwargs)
    return result
