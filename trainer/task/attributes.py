"""The rest of LightningModule's public surface on Task: properties (dtype, on_gpu, strict_loading, ...),
helpers (toggled_optimizer; export is trainer/task/export.py) and the names Tandem refuses, each with an
error that names it and says what to do. tests/test_attributes.py walks Lightning's list of names."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from tandem_core.errors import TaskError
from tandem_core.hooks import default


def _no_loader(name: str) -> Any:
    """A *_dataloader default: Lightning's raises too; Tandem's session never calls it (it is a default)."""

    @default
    def loader(self: Any) -> Any:
        raise TaskError(
            f"{type(self).__name__}.{name}() is not implemented: define it, or pass the loaders to the Trainer "
            "(fit(task, train_dataloaders, val_dataloaders), test(task, dataloaders)) or a DataModule."
        )

    loader.__name__ = loader.__qualname__ = name
    loader.__doc__ = f"Return the loader(s) of this stage (default: none; {name} is not implemented)."
    return loader


class LightningAttributes:
    """Mixed into Task (a torch.nn.Module)."""

    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"
    #: prepare_data() on local rank 0 of every node (True) or on global rank 0 only (False)
    prepare_data_per_node: bool = True

    # (defaults without annotations: TorchScript would try to resolve them when scripting the task)
    _trainer = None
    _strict_loading = None

    train_dataloader = _no_loader("train_dataloader")
    val_dataloader = _no_loader("val_dataloader")
    test_dataloader = _no_loader("test_dataloader")
    predict_dataloader = _no_loader("predict_dataloader")

    # ----- properties ---------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the parameters (torch's default dtype for a task without any)."""
        for t in (*self.parameters(), *self.buffers()):  # type: ignore[attr-defined]
            if t.is_floating_point():
                return t.dtype
        return torch.get_default_dtype()

    @property
    def on_gpu(self) -> bool:
        """True when the task runs on a CUDA device."""
        return self.device.type == "cuda"  # type: ignore[attr-defined]

    @property
    def strict_loading(self) -> bool:
        """Whether checkpoints load with load_state_dict(strict=True) (set False to load partial weights)."""
        return self._strict_loading in (None, True)

    @strict_loading.setter
    def strict_loading(self, strict: bool) -> None:
        self._strict_loading = strict

    @property
    def fabric(self) -> None:
        """Lightning Fabric's handle: None under a Trainer, as in Lightning (Tandem has no Fabric)."""
        return None

    @property
    def device_mesh(self) -> Any:
        """The strategy's device mesh while one is in use (fsdp; model_parallel's 2-D ("data_parallel",
        "tensor_parallel") mesh, set before configure_model), else None."""
        trainer = self._trainer
        return None if trainer is None else getattr(trainer.strategy, "device_mesh", None)

    # ----- helpers ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """toggle_optimizer(optimizer) inside the block, untoggle_optimizer after it."""
        self.toggle_optimizer(optimizer)  # type: ignore[attr-defined]
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)  # type: ignore[attr-defined]

    def to_tensorrt(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: TensorRT needs torch_tensorrt and a CUDA device."""
        raise TaskError(
            "to_tensorrt() is not supported by Tandem: compile with torch_tensorrt.compile(task, ...) yourself, "
            "or export with task.to_onnx(...) / task.to_torchscript(...)."
        )

    def configure_sharded_model(self) -> Any:
        """Refused when called: Lightning 2.1 renamed it configure_model (a subclass defining it is refused
        when a stage starts). A method, not a raising property: torch.jit.script reads every attribute."""
        raise TaskError("configure_sharded_model() was renamed configure_model() in Lightning 2.1; use that.")

    configure_sharded_model._tandem_refusal = True  # type: ignore[attr-defined]  # Task's own, not a user's
