"""The Task methods that have a default behaviour a user may override (Lightning's names and signatures).

The loop calls each of them only where the task overrides it (trainer.hooks.overrides), so a plain task
takes the direct path; the defaults here are what that direct path does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from strategies.batch import move_to_device
from strategies.clipping import clip_gradients
from tandem_core.errors import ConfigError
from tandem_core.hooks import default

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class TaskDefaults:
    """Mixed into Task: optimizer stepping, clipping, scheduling, batch transfer, model set-up."""

    trainer: Trainer

    # ----- set-up ---------------------------------------------------------------------------------
    @default
    def prepare_data(self) -> None:
        """Download or prepare files; called once per node (local rank 0) before setup."""

    @default
    def configure_model(self) -> None:
        """Build modules lazily here; called at the start of every stage, before the model is placed."""

    @default
    def configure_callbacks(self) -> Any:
        """Callbacks this task needs; they replace the Trainer's callbacks of the same type."""
        return []

    # ----- batches --------------------------------------------------------------------------------
    @default
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch before it is moved to the device."""
        return batch

    @default
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move the batch to `device` (tensors in lists, tuples, dicts and dataclasses)."""
        return move_to_device(batch, device)

    @default
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch after it was moved to the device."""
        return batch

    # ----- optimization ---------------------------------------------------------------------------
    @default
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Compute gradients of the (already scaled) loss; the strategy arranges communication around it."""
        loss.backward(*args, **kwargs)

    @default
    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        """Step the optimizer; the closure runs training_step and backward (automatic optimization)."""
        optimizer.step(closure=optimizer_closure)

    @default
    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Reset the gradients at the start of an accumulation window."""
        optimizer.zero_grad()

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip before the step with the Trainer's gradient_clip_val/algorithm (override to change per step)."""
        self.clip_gradients(
            optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm
        )

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the optimizer's gradients by total norm ("norm") or by value ("value"); an argument left None
        is the Trainer's (gradient_clip_val: none, 0: no clipping; algorithm: "norm"), one given must agree
        with the Trainer's where that is set (as Lightning's: ConfigError otherwise)."""
        trainer = getattr(self, "_trainer", None)
        cfg = getattr(trainer, "config", None)
        own_val = getattr(cfg, "gradient_clip_val", None)
        own_algorithm = getattr(cfg, "gradient_clip_algorithm", None)
        if gradient_clip_val is None:
            gradient_clip_val = own_val or 0.0
        elif own_val is not None and own_val != gradient_clip_val:
            raise ConfigError(
                f"clip_gradients(gradient_clip_val={gradient_clip_val!r}) differs from "
                f"Trainer(gradient_clip_val={own_val!r}); set only one of them."
            )
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = own_algorithm or "norm"
        else:
            gradient_clip_algorithm = str(gradient_clip_algorithm).lower()
            if own_algorithm is not None and own_algorithm != gradient_clip_algorithm:
                raise ConfigError(
                    f"clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r}) differs from "
                    f"Trainer(gradient_clip_algorithm={own_algorithm!r}); set only one of them."
                )
        if not isinstance(gradient_clip_val, (int, float)):
            raise TypeError(f"gradient_clip_val must be an int or a float, got {gradient_clip_val!r}")
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ConfigError(
                f"gradient_clip_algorithm must be 'norm' or 'value', got {gradient_clip_algorithm!r}"
            )
        if gradient_clip_val:
            group = getattr(
                getattr(trainer, "strategy", None), "grad_norm_group", None
            )  # pipeline: global norm
            clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm, group)

    @default
    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step one scheduler (with the monitored value for ReduceLROnPlateau)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Compute gradients only for this optimizer's parameters (multi-optimizer manual optimization)."""
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        saved = getattr(self, "_toggled", None)
        if saved is None:  # the flags as the user set them, restored by untoggle_optimizer
            params = [p for opt in self.trainer.optimizers for g in opt.param_groups for p in g["params"]]
            saved = {id(p): (p, p.requires_grad) for p in params}
            object.__setattr__(self, "_toggled", saved)
        for key, (p, requires_grad) in saved.items():
            p.requires_grad = requires_grad if key in own else False

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Give back the requires_grad flags that toggle_optimizer changed."""
        for p, requires_grad in (getattr(self, "_toggled", None) or {}).values():
            p.requires_grad = requires_grad
        object.__setattr__(self, "_toggled", None)

    # ----- evaluation mode ------------------------------------------------------------------------
    @default
    def on_validation_model_eval(self) -> None:
        """Put the model in evaluation mode for validation."""
        self.eval()  # type: ignore[attr-defined]

    @default
    def on_validation_model_train(self) -> None:
        """Put the model back in training mode after validation."""
        self.train()  # type: ignore[attr-defined]

    @default
    def on_validation_model_zero_grad(self) -> None:
        """Drop gradients before validation starts (they are not needed there)."""
        self.zero_grad()  # type: ignore[attr-defined]

    @default
    def on_test_model_eval(self) -> None:
        """Put the model in evaluation mode for testing."""
        self.eval()  # type: ignore[attr-defined]

    @default
    def on_test_model_train(self) -> None:
        """Put the model back in training mode after testing."""
        self.train()  # type: ignore[attr-defined]

    @default
    def on_predict_model_eval(self) -> None:
        """Put the model in evaluation mode for prediction."""
        self.eval()  # type: ignore[attr-defined]


def clipping_overridden(task: object) -> bool:
    """Whether the task's class overrides configure_gradient_clipping or clip_gradients (TaskDefaults' pair
    clips only with a gradient_clip_val)."""
    cls, own = type(task), getattr(task, "__dict__", {})
    return any(
        (callable(own[name]) if name in own else getattr(cls, name, None) is not getattr(TaskDefaults, name))
        for name in ("configure_gradient_clipping", "clip_gradients")
    )
