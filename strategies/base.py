"""The Strategy interface: where the task runs and how gradients are combined."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from strategies.batch import move_to_device
from strategies.precision import Precision
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task import Task


class Strategy:
    """Base class for device placement, data sampling, precision and gradient reduction.

    The Trainer drives every strategy through these methods only. Example::

        class MyStrategy(Strategy):
            name = "mine"
            def setup(self, task): ...
    """

    name = "base"
    use_distributed_sampler = True  # the Trainer sets it from its option of the same name

    def __init__(self, accelerator: str = "auto", precision: Precision | str | int = "32-true") -> None:
        self.accelerator = accelerator
        self.precision = precision if isinstance(precision, Precision) else Precision(precision)
        self._root_device = torch.device("cpu")
        self._nullcontext = contextlib.nullcontext()

    # ----- where we are -------------------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        return self._root_device

    @property
    def world_size(self) -> int:
        return 1

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    # ----- life cycle ---------------------------------------------------------------------------
    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run fn in this process (multi-process strategies start their workers here)."""
        return fn(*args, **kwargs)

    def setup_environment(self) -> None:
        """Prepare devices and process groups before the task is touched."""

    def setup(self, task: Task) -> None:
        """Move the task to the root device in the parameter dtype of the precision."""
        self.precision.setup(self.root_device)
        task.to(device=self.root_device, dtype=self.precision.param_dtype)

    def teardown(self) -> None:
        """Release what setup and setup_environment acquired."""

    # ----- data ---------------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Adapt a loader to this strategy (distributed strategies inject a sampler)."""
        return loader

    def batch_to_device(self, batch: Any) -> Any:
        return move_to_device(batch, self.root_device, self.precision.param_dtype)

    # ----- steps --------------------------------------------------------------------------------
    def training_step(self, task: Task, batch: Any, batch_idx: int) -> Any:
        return task.training_step(batch, batch_idx)

    def eval_step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        """Run validation_step, test_step or predict_step (`hook`); dataloader_idx is passed (even 0) only
        when there are several loaders, as in Lightning."""
        fn = getattr(task, hook)
        return fn(batch, batch_idx) if dataloader_idx is None else fn(batch, batch_idx, dataloader_idx)

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)

    def no_sync(self, enabled: bool = True) -> contextlib.AbstractContextManager[Any]:
        """Context in which backward does not communicate (gradient accumulation)."""
        return self._nullcontext

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], Any] | None = None,
        on_before_step: Callable[[torch.optim.Optimizer], None] | None = None,
        clip_val: float | None = None,
        clip_algorithm: str = "norm",
    ) -> Any:
        """Finish gradient reduction, unscale, call the hook, clip, and step."""
        self.precision.unscale(optimizer)
        if on_before_step is not None:
            on_before_step(optimizer)
        if clip_val:
            clip_gradients(optimizer, clip_val, clip_algorithm)
        return self.precision.step(optimizer, closure)

    # ----- agreement between ranks (trivial on one process) -------------------------------------
    stop_check_interval = 1  # optimizer steps between checks of a stop request (SIGINT/SIGTERM)

    def agree_num_batches(self, n: int | float) -> int | float:
        """The number of batches every rank runs this epoch."""
        return n

    def join(self, has_batch: bool) -> bool:
        """True while every rank still has a batch."""
        return has_batch

    def any_rank(self, flag: bool) -> bool:
        """True if the flag is set on any rank."""
        return flag

    # ----- collectives (identity on one process) ------------------------------------------------
    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack each rank's tensor along a new dim 0."""
        return tensor.unsqueeze(0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        pass

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (picklable objects)."""
        return [obj]

    def state_dict(self) -> dict[str, Any]:
        return {"precision": self.precision.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.precision.load_state_dict(state.get("precision", {}))


def clip_gradients(optimizer: torch.optim.Optimizer, clip_val: float, algorithm: str = "norm") -> None:
    """Clip the gradients of the optimizer's parameters by total norm or by value."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, clip_val)
    elif algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, clip_val)
    else:
        raise ConfigError(f"gradient_clip_algorithm must be 'norm' or 'value', got {algorithm!r}")


def iter_params(task: torch.nn.Module) -> Iterator[torch.nn.Parameter]:
    return (p for p in task.parameters() if p.requires_grad)
