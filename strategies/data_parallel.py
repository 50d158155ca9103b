"""Threaded DataParallel: one process copies the task onto every device each step, splits the batch along
dim 0, runs the replicas in threads and gathers their outputs on the primary device."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import call_step
from strategies.batch import apply_to_tensors
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision
from strategies.replicate import Replicas, tensors_in
from strategies.single import pick_device
from tandem_core.errors import ConfigError, TaskError

if TYPE_CHECKING:
    from trainer.task.base import Task


class ReplicaError(RuntimeError):
    """A replica failed with an exception that cannot be re-created with the replica's index in its message."""


class DataParallelStrategy(ParallelStrategy):
    """Single-process data parallelism over `devices` replicas driven from threads (config name ``"dp"``).

    Each step the task is replicated onto every device with autograd connected to the primary parameters,
    every tensor of the batch is split along dim 0 like ``torch.chunk`` (a batch smaller than the number of
    devices gives fewer chunks), ``training_step`` runs on each replica in its own thread, and the replicas'
    losses are averaged weighted by chunk size, so that a mean-reduced loss gives the gradient of the whole
    batch. Buffers (BatchNorm statistics) come from replica 0, as in ``torch.nn.DataParallel``; values
    logged with ``self.log`` are merged over the replicas and logged once. On CUDA ``devices=N`` uses
    cuda:0..N-1; on the CPU it makes N replicas on the CPU. Example::

        Trainer(strategy="dp", devices=2).fit(task)
        Trainer(strategy=DataParallelStrategy(accelerator="cuda", devices=[0, 2])).fit(task)
    """

    name = "dp"

    def __init__(
        self,
        accelerator: str | None = None,
        devices: int | str | Sequence[int] | None = None,
        precision: Precision | str | int | None = None,
    ) -> None:
        super().__init__(accelerator, precision)
        self.devices = devices  # None: the Trainer's devices
        self._device_list: list[torch.device] | None = None
        if devices is not None:  # a bad count, list or accelerator is a ConfigError now, not at fit
            _device_indices(devices)
            if accelerator is not None:
                self._device_list = _resolve_devices(accelerator, devices)
        self._local = threading.local()  # the device of the replica running in this thread
        self._threads: _ReplicaThreads | None = None
        self._metric_clones: dict[tuple[int, int], tuple[weakref.ref[Any], torch.nn.Module]] = {}
        # cumulative seconds per phase, for benchmarks (CUDA work is asynchronous: synchronize to time it)
        self.stats: dict[str, float] = dict(
            steps=0, scatter_s=0.0, replicate_s=0.0, parallel_s=0.0, gather_s=0.0, backward_s=0.0
        )

    @property
    def device_list(self) -> list[torch.device]:
        """The replicas' devices (resolved from `devices` and the accelerator on first use)."""
        if self._device_list is None:
            self._device_list = _resolve_devices(
                self.accelerator or "auto", 1 if self.devices is None else self.devices
            )
        return self._device_list

    @property
    def root_device(self) -> torch.device:
        """The primary device, or inside a replica's step the replica's device (so `Task.device` is right)."""
        device = getattr(self._local, "device", None)
        return self.device_list[0] if device is None else device

    def compile(self, task: Task, apply: Callable[[Task], Callable[[], None]]) -> Callable[[], None]:
        raise ConfigError(
            "strategy='dp' cannot run a compiled task: it copies the task into a fresh replica per device at "
            "every step and runs the copies in threads, so compiled code (bound to the task itself) would "
            "not run on the replicas. Use strategy='ddp' (one process per device; compile keeps its "
            "overlap) or 'single', or drop compile."
        )

    def teardown(self) -> None:
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        self._metric_clones.clear()

    # ----- steps --------------------------------------------------------------------------------
    def step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        t0 = time.perf_counter()
        chunks, sizes = scatter(batch, self.device_list)
        if len(chunks) == 1:  # one device, or a batch of one sample: nothing to split
            return call_step(getattr(task, hook), batch, batch_idx, dataloader_idx)
        if hook == "training_step" and not task.automatic_optimization:
            raise ConfigError(
                "strategy='dp' runs training_step on several replicas at once, so it cannot step optimizers "
                "from inside it; use automatic optimization, or strategy='single' or 'ddp'."
            )
        t1 = time.perf_counter()
        devices = self.device_list[: len(chunks)]
        replicas = Replicas(task, devices, torch.is_grad_enabled(), self._metric_clones)
        t2 = time.perf_counter()
        modules = replicas.modules
        outputs = self._in_threads(
            lambda i: call_step(getattr(modules[i], hook), chunks[i], batch_idx, dataloader_idx), devices
        )
        t3 = time.perf_counter()
        replicas.merge_metrics()
        root = self.device_list[0]
        replicas.replay_logs(task, sizes, root)
        out = gather(outputs, sizes, root)
        if hook == "training_step" and root.type == "cpu" and torch.is_grad_enabled():
            foreign = replicas.foreign or any(t.requires_grad for t in tensors_in(batch))
            out = out if foreign else self._parallel_backward_loss(out, outputs, sizes, replicas)
        t4 = time.perf_counter()
        s = self.stats
        s["steps"] += 1
        s["scatter_s"] += t1 - t0
        s["replicate_s"] += t2 - t1
        s["parallel_s"] += t3 - t2
        s["gather_s"] += t4 - t3
        return out

    def _parallel_backward_loss(
        self, out: Any, outputs: list[Any], sizes: list[int], replicas: Replicas
    ) -> Any:
        """Give the gathered loss a backward that runs each replica's backward in its own thread.

        CPU autograd runs all CPU work of a backward call on the calling thread, so without this the
        replicas' backward passes would run one after another (on CUDA each device has its own thread)."""
        losses = [o.get("loss") if isinstance(o, Mapping) else o for o in outputs]
        if not replicas.inputs[0] or not all(
            isinstance(x, torch.Tensor) and x.ndim == 0 and x.requires_grad for x in losses
        ):
            return out  # not a loss: the loop reports it
        loss = _GatherLoss.apply(self, sizes, losses, replicas.inputs, *replicas.inputs[0])
        if isinstance(out, torch.Tensor):
            return loss
        out["loss"] = loss  # `out` is gather's own new container
        return out

    def backward(
        self, loss: torch.Tensor, sync: bool = True, run: Callable[[torch.Tensor], Any] | None = None
    ) -> None:
        t0 = time.perf_counter()
        super().backward(loss, sync, run)
        self.stats["backward_s"] += time.perf_counter() - t0

    def _in_threads(self, fn: Callable[[int], Any], devices: list[torch.device]) -> list[Any]:
        """fn(i) for every replica i in its own thread (replica 0 in this one), with this thread's grad
        mode, autocast and CUDA streams; the first failure is re-raised naming its replica."""
        grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        kind = self.device_list[0].type
        autocast = torch.is_autocast_enabled(kind) if kind in ("cpu", "cuda", "mps") else False
        cast_dtype = torch.get_autocast_dtype(kind) if autocast else None
        cast_cache = torch.is_autocast_cache_enabled()
        streams = [torch.cuda.current_stream(d) for d in devices] if kind == "cuda" else None

        def run(i: int) -> tuple[bool, Any]:
            self._local.device = devices[i]
            try:
                with contextlib.ExitStack() as stack:
                    stack.enter_context(torch.inference_mode() if inference else torch.set_grad_enabled(grad))
                    if autocast:
                        stack.enter_context(torch.autocast(kind, dtype=cast_dtype, cache_enabled=cast_cache))
                    if streams is not None:
                        stack.enter_context(torch.cuda.device(devices[i]))
                        stack.enter_context(torch.cuda.stream(streams[i]))
                    return True, fn(i)
            except BaseException as e:  # handed to the main thread, which re-raises it
                return False, e
            finally:
                self._local.device = None

        if kind == "cpu" and torch.are_deterministic_algorithms_enabled():
            # CPU replicas share one random generator: draws (dropout) in thread order would differ run to run
            results = [run(i) for i in range(len(devices))]
        else:
            if self._threads is None:
                self._threads = _ReplicaThreads(len(self.device_list))
            futures = [self._threads.submit(i, run) for i in range(1, len(devices))]
            results = [run(0)] + [f.result() for f in futures]
        failed = [(i, value) for i, (ok, value) in enumerate(results) if not ok]
        if failed:
            i, exc = failed[0]
            named = _name_replica(exc, i, devices[i], [j for j, _ in failed[1:]])
            if named is exc:
                raise exc
            raise named from exc
        return [value for _, value in results]


class _ReplicaThreads:
    """One long-lived thread per replica 1..N-1 (a pool could run two replicas on one thread).

    `close` joins them: a thread still running when the interpreter shuts down is stopped by Python
    (pthread_exit) the moment it wants the GIL back, and inside torch code (an op, or freeing a replica's
    tensors and graph) that unwinds through a C++ destructor and aborts the process after a good run
    ("terminate called without an active exception", exit 134)."""

    def __init__(self, n: int) -> None:
        self.queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(n)]
        self.threads = [
            threading.Thread(target=self._serve, args=(self.queues[i],), name=f"tandem-dp-{i}", daemon=True)
            for i in range(1, n)
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def _serve(q: queue.SimpleQueue[Any]) -> None:
        while (job := q.get()) is not None:
            future, fn, i = job
            future.set_result(fn(i))  # fn catches every exception itself
            del job, future, fn  # free the replicas' tensors now, not when the next job comes

    def submit(self, i: int, fn: Callable[[int], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self.queues[i].put((future, fn, i))
        return future

    def close(self) -> None:
        """Stop the threads and wait until each has ended, its last job's tensors freed."""
        for q in self.queues[1:]:
            q.put(None)
        for t in self.threads:
            t.join()


def _device_indices(devices: Any) -> list[int]:
    if devices == "auto":
        return [0]
    indices = list(range(devices)) if isinstance(devices, int) else list(devices)
    if not indices or not all(isinstance(i, int) and i >= 0 for i in indices):
        raise ConfigError(
            f"strategy='dp' needs devices >= 1 (a count or a list of device indices), got {devices!r}"
        )
    return indices


def _resolve_devices(accelerator: str, devices: int | str | Sequence[int]) -> list[torch.device]:
    if devices == "auto":
        devices = max(torch.cuda.device_count(), 1) if accelerator in ("auto", "cuda", "gpu") else 1
    indices = _device_indices(devices)
    first = pick_device(accelerator, indices[0])
    if first.type != "cuda":  # CPU (or MPS): N replicas on the one device
        return [first] * len(indices)
    count = torch.cuda.device_count()
    missing = [i for i in indices if i >= count]
    if missing:
        raise ConfigError(
            f"strategy='dp' with devices={devices!r} needs CUDA devices {missing} but only {count} are visible; "
            f"use devices <= {count}."
        )
    return [torch.device("cuda", i) for i in indices]


def _name_replica(exc: BaseException, index: int, device: torch.device, others: list[int]) -> BaseException:
    """The exception of replica `index` again, with the replica named in its message (same type if possible)."""
    if not isinstance(exc, Exception):
        return exc  # KeyboardInterrupt, SystemExit: as they are
    also = f" (replicas {others} failed too)" if others else ""
    msg = f"in dp replica {index} on {device}: {type(exc).__name__}: {exc}{also}"
    try:
        named = type(exc)(msg)
    except Exception:
        named = ReplicaError(msg)
    named.replica_index = index  # type: ignore[attr-defined]
    return named


# ----- scatter and gather ---------------------------------------------------------------------------
def scatter(batch: Any, devices: Sequence[torch.device]) -> tuple[list[Any], list[int]]:
    """Split every tensor of a nested batch along dim 0 over `devices`, as torch.chunk splits.

    Returns the per-replica batches (copies of the containers, tensors moved to the replica's device;
    0-dim tensors and other objects are given to every replica) and the number of samples in each.
    """
    parts: list[tuple[torch.Tensor, ...]] = []
    lengths: dict[int, None] = {}

    def split(t: torch.Tensor) -> torch.Tensor:
        if t.ndim > 0:
            parts.append(t.chunk(len(devices)))
            lengths[int(t.shape[0])] = None
        return t

    apply_to_tensors(batch, split)
    if len(lengths) > 1:  # torch's scatter would silently drop the extra chunks of the longer tensors
        raise TaskError(
            f"strategy='dp' splits every tensor of the batch along dim 0, but the batch holds tensors of "
            f"different lengths {sorted(lengths)}; give every tensor the batch dimension first, or use 'ddp'."
        )
    if len(devices) == 1 or not parts or not next(iter(lengths)):
        return [batch], [next(iter(lengths), 1)]
    chunks = []
    for i in range(len(parts[0])):
        it = iter(parts)
        device = devices[i]
        chunks.append(
            apply_to_tensors(batch, lambda t, i=i, it=it, d=device: next(it)[i].to(d) if t.ndim else t.to(d))
        )
    return chunks, [int(p.shape[0]) for p in parts[0]]


def gather(outputs: list[Any], sizes: list[int], device: torch.device) -> Any:
    """Combine the replicas' outputs on `device`: scalars as the chunk-size-weighted mean, other tensors
    concatenated along dim 0, containers element by element; other values once if equal, else as a list."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(o, torch.Tensor) and o.ndim == first.ndim for o in outputs):
            raise TaskError(f"dp replicas returned different outputs: {[type(o).__name__ for o in outputs]}")
        moved = [o.to(device) for o in outputs]
        if first.ndim == 0:
            total = float(sum(sizes))
            return torch.stack([o * (n / total) for o, n in zip(moved, sizes)]).sum()
        return torch.cat(moved)
    if first is None or not all(type(o) is type(first) for o in outputs):
        if all(o is None for o in outputs):
            return None
        raise TaskError(f"dp replicas returned different outputs: {[type(o).__name__ for o in outputs]}")
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(gather(list(xs), sizes, device) for xs in zip(*outputs)))
    if isinstance(first, (list, tuple)) and all(len(o) == len(first) for o in outputs):
        return type(first)(gather(list(xs), sizes, device) for xs in zip(*outputs))
    if isinstance(first, Mapping) and all(o.keys() == first.keys() for o in outputs):
        return type(first)({k: gather([o[k] for o in outputs], sizes, device) for k in first})
    try:
        same = all(bool(o == first) for o in outputs)
    except Exception:
        same = False
    return first if same else list(outputs)


class _GatherLoss(torch.autograd.Function):
    """The chunk-size-weighted mean of the replicas' losses. Backward computes each replica's gradients in
    that replica's thread and sums them, in replica order, into the task's tensors (the trailing inputs)."""

    @staticmethod
    def forward(ctx: Any, strategy: DataParallelStrategy, sizes: list[int], losses: list[torch.Tensor],
                inputs: list[list[torch.Tensor]], *tensors: torch.Tensor) -> torch.Tensor:  # fmt: skip
        total = float(sum(sizes))
        ctx.strategy, ctx.losses, ctx.inputs = strategy, losses, inputs
        ctx.weights = [n / total for n in sizes]
        root = tensors[0].device
        return torch.stack([x.detach().to(root) * w for x, w in zip(losses, ctx.weights)]).sum()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        losses, inputs, weights = ctx.losses, ctx.inputs, ctx.weights
        if losses is None:
            raise RuntimeError(
                "a dp loss can be backpropagated once (its replicas' graphs are freed by then)"
            )
        ctx.losses = ctx.inputs = None  # the replicas' graphs are freed by their backward

        def replica_grads(i: int) -> tuple[torch.Tensor | None, ...]:
            g = (grad * weights[i]).to(losses[i].device)
            return torch.autograd.grad(losses[i], inputs[i], g, allow_unused=True)

        per_replica = ctx.strategy._in_threads(replica_grads, ctx.strategy.device_list[: len(losses)])
        sums: list[torch.Tensor | None] = []
        for j, t in enumerate(inputs[0]):
            parts = [grads[j].to(t.device) for grads in per_replica if grads[j] is not None]
            sums.append(torch.stack(parts).sum(0) if len(parts) > 1 else parts[0] if parts else None)
        return (None, None, None, None, *sums)
