"""ThroughputMonitor: log Throughput's rates (batches, samples, items, FLOPs per second, MFU) per stage."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from callbacks.throughput.meter import Throughput, get_available_flops

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer

_STAGE = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}  # what a stage runs
_PHASE = {
    "train": "train",
    "val": "validate",
    "test": "test",
    "predict": "predict",
}  # Lightning's stage names


class ThroughputMonitor(Callback):
    """Rank 0 logs ``train/…``, ``validate/…``, ``test/…`` and ``predict/…`` throughput (see Throughput) on
    the logging steps. `batch_size_fn(batch)` gives a batch's samples, `length_fn(batch)` its items (tokens,
    say); FLOPs come from the task's ``flops_per_batch`` attribute (``measure_flops`` computes one), MFU
    from the GPU's peak for the run's precision. `kwargs` reach Throughput (``window_size``, ``separator``).
    Validation time is not counted in training's. Example: ``ThroughputMonitor(batch_size_fn=lambda b: b[0].size(0))``.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int],
        length_fn: Callable[[Any], int] | None = None,
        **kwargs: Any,
    ) -> None:
        self.kwargs = kwargs
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.available_flops: int | None = None
        self._throughputs: dict[str, Throughput] = {}
        self._t0s: dict[str, float] = {}
        self._eval_total: dict[str, int] = {}  # evaluation batches per "<entry>/<stage>", never reset
        self._run_batches: dict[str, int] = {}
        self._lengths: dict[str, int] = {}
        self._samples: dict[str, int] = {}
        self._batches: dict[str, int] = {}
        self._module_has_flops: bool | None = None

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        # the dtype the precision computes in (bf16 under "bf16-mixed" and "bf16-true", ...): its peak is MFU's
        dtype = getattr(trainer.precision, "compute_dtype", torch.float32)
        self.available_flops = get_available_flops(trainer.strategy.root_device, dtype)
        stages = [_STAGE[stage]] + (["validate"] if stage == "fit" else [])
        for s in stages:
            self._throughputs[s] = Throughput(
                available_flops=self.available_flops, world_size=trainer.world_size, **self.kwargs
            )

    def _stage(self, trainer: Trainer) -> str:
        return _PHASE[str(trainer.state.phase)]

    def _start(self, trainer: Trainer, stage: str) -> None:
        if trainer.state.entry == "fit" or stage not in self._samples:
            self._throughputs[stage].reset()
            self._lengths[stage] = self._samples[stage] = self._batches[stage] = 0
        self._run_batches[stage] = 0  # this run's batches: every log_every_n_steps-th one logs (Lightning's)
        self._t0s[stage] = time.perf_counter()

    @torch.inference_mode()
    def _update(self, trainer: Trainer, task: Task, batch: Any, stage: str) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # the time of work done, not of work queued
        elapsed = time.perf_counter() - self._t0s[stage]
        if self.length_fn is not None:
            self._lengths[stage] += self.length_fn(batch)
        if self._module_has_flops is None:
            self._module_has_flops = hasattr(task, "flops_per_batch")
            if not self._module_has_flops:
                warnings.warn(
                    "When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or property"
                    f" in {type(task).__name__} to compute the FLOPs (and MFU); `measure_flops` computes one.",
                    UserWarning,
                    stacklevel=2,
                )
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        self._throughputs[stage].update(
            time=elapsed,
            batches=self._batches[stage],
            samples=self._samples[stage],
            lengths=None if self.length_fn is None else self._lengths[stage],
            flops=task.flops_per_batch if self._module_has_flops else None,  # type: ignore[attr-defined]
        )

    def _compute(self, trainer: Trainer, stage: str, step: int | None, count: int) -> None:
        """Log the rates when `count` (the optimizer steps of fit, or this evaluation's batches) is a multiple of
        log_every_n_steps (0: never), or the run is stopping, as Lightning's logger connector decides."""
        n = trainer.config.log_every_n_steps
        if not n or not (count % n == 0 or trainer.should_stop):
            return
        tp = self._throughputs[stage]
        metrics = {f"{stage}{tp.separator}{k}": float(v) for k, v in tp.compute().items()}
        trainer._log_metrics(metrics, step)  # the loop's rules: Lightning's step, "epoch" added without one

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        if trainer.is_global_zero:
            self._start(trainer, "train")

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._update(trainer, task, batch, "train")
        k = trainer.accumulate_grad_batches
        if (batch_idx + 1) % k == 0 or batch_idx + 1 == trainer.num_training_batches:  # an optimizer step
            self._compute(trainer, "train", None, trainer.global_step)

    def _eval_start(self, trainer: Trainer) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start(trainer, self._stage(trainer))

    def _eval_batch_end(self, trainer: Trainer, task: Task, batch: Any) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        stage = self._stage(trainer)
        self._update(trainer, task, batch, stage)
        # the step: this kind of evaluation's batches so far, over every run of it (Lightning's loop total)
        key = f"{trainer.state.entry}/{stage}"
        self._eval_total[key] = self._eval_total.get(key, 0) + 1
        self._run_batches[stage] += 1
        self._compute(trainer, stage, self._eval_total[key], self._run_batches[stage])

    def on_validation_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(trainer)

    def on_validation_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, *_: Any
    ) -> None:
        self._eval_batch_end(trainer, task, batch)

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        """Inside fit: move training's clock past this validation, so its rates count training alone."""
        if (
            not trainer.is_global_zero
            or trainer.sanity_checking
            or trainer.state.entry != "fit"
            or "train" not in self._t0s
        ):
            return
        train_t, val_t = self._throughputs["train"]._time, self._throughputs["validate"]._time
        trained_until = self._t0s["train"] + (train_t[-1] if train_t else 0.0)
        self._t0s["train"] += (self._t0s["validate"] - trained_until) + (val_t[-1] if val_t else 0.0)

    def on_test_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(trainer)

    def on_test_batch_end(self, trainer: Trainer, task: Task, outputs: Any, batch: Any, *_: Any) -> None:
        self._eval_batch_end(trainer, task, batch)

    def on_predict_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(trainer)

    def on_predict_batch_end(self, trainer: Trainer, task: Task, outputs: Any, batch: Any, *_: Any) -> None:
        self._eval_batch_end(trainer, task, batch)
