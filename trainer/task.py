"""Task: the user's model, its steps, and the hooks the Trainer calls (Lightning's names)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import TaskError
from trainer.hooks import TASK, add_hook_stubs

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``hparams.lr``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(f"no hyperparameter {key!r} (have: {sorted(self)})") from e

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


class Task(torch.nn.Module):
    """A torch Module that knows how to train itself.

    Example::

        class Classifier(Task):
            def __init__(self, lr=0.1):
                super().__init__(); self.save_hyperparameters(); self.net = torch.nn.Linear(4, 2)
            def training_step(self, batch, batch_idx):
                x, y = batch; loss = F.cross_entropy(self.net(x), y); self.log("train/loss", loss); return loss
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
    """

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self._hparams = AttributeDict()
        self._optimizers: list[Any] = []  # TaskOptimizer wrappers, set when fit starts
        self.automatic_optimization = True

    # ----- what the user implements -------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Return the loss (a scalar tensor) or a dict with key 'loss'."""
        raise TaskError(f"{type(self).__name__} must implement training_step(self, batch, batch_idx).")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute and log validation metrics for one batch."""

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute and log test metrics for one batch."""

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """Return predictions for one batch (default: forward on the batch, or its first element)."""
        if type(self).forward is torch.nn.Module.forward:
            raise TaskError(f"{type(self).__name__} needs forward() or predict_step() to predict.")
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x)

    def configure_optimizers(self) -> Any:
        """Return an optimizer, a list of them, or a dict with 'optimizer' and 'lr_scheduler'."""
        raise TaskError(f"{type(self).__name__} must implement configure_optimizers() to be trained.")

    # ----- what the Trainer provides ------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise TaskError(
                f"{type(self).__name__} is not attached to a Trainer; call trainer.fit(task) first."
            )
        return self._trainer

    @property
    def device(self) -> torch.device:
        if self._trainer is not None:
            return self._trainer.strategy.root_device
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    def save_hyperparameters(self, *names: str, ignore: Sequence[str] | str = ()) -> None:
        """Record the caller's __init__ arguments (or just `names`) in self.hparams and in checkpoints."""
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is None:
            return
        # the arguments of the __init__ that called us (a parent's, when a subclass calls super().__init__)
        code = caller.f_code
        n_args = code.co_argcount + code.co_kwonlyargcount
        arg_names = code.co_varnames[:n_args]
        local = caller.f_locals
        args = {
            k: local[k] for k in arg_names if k in local and local[k] is not self and not k.startswith("_")
        }
        if code.co_flags & inspect.CO_VARKEYWORDS:  # **kwargs of __init__ are hyperparameters too
            var_kw = local.get(code.co_varnames[n_args + bool(code.co_flags & inspect.CO_VARARGS)])
            if isinstance(var_kw, Mapping):
                args.update(var_kw)
        ignored = {ignore} if isinstance(ignore, str) else set(ignore)
        if names:
            args = {k: v for k, v in args.items() if k in names}
        self._hparams.update({k: v for k, v in args.items() if k not in ignored})

    def log(self, name: str, value: Any, **kwargs: Any) -> None:
        """Record a metric; see trainer.metrics.MetricStore.log for the options (Lightning's)."""
        if self._trainer is not None:
            self._trainer.metric_store.log(name, value, **kwargs)

    def log_dict(self, values: Mapping[str, Any], **kwargs: Any) -> None:
        """Log every item of a mapping with the same options."""
        for name, value in values.items():
            self.log(name, value, **kwargs)

    def optimizers(self) -> Any:
        """The optimizer(s), wrapped so that .step() goes through the strategy (manual optimization)."""
        self.trainer  # noqa: B018 (raises the not-attached error)
        opts = self._optimizers
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from configure_optimizers, or None."""
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        return None if not scheds else scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Backward through the strategy and precision (scaling, DDP hooks), with the backward hooks."""
        trainer = self.trainer
        trainer.hooks.call("on_before_backward", loss)
        trainer.strategy.backward(loss)
        trainer.hooks.call("on_after_backward")

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on global rank 0 only."""
        if self.global_rank == 0:
            print(*args, **kwargs)


add_hook_stubs(Task, TASK)  # on_fit_start, on_train_batch_end, ... as documented no-ops (trainer/hooks.py)
