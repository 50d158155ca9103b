"""The Task methods for inference and export: freeze/unfreeze, example_input_array, to_onnx, to_torchscript."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from tandem_core.errors import ConfigError, require
from tandem_core.rank_zero import rank_zero_deprecation


class ExportMixin:
    """Mixed into Task (Lightning's LightningModule methods of the same names).

    Example::

        task.example_input_array = torch.randn(1, 64)   # also shown by the model summary: in/out sizes
        task.to_onnx("model.onnx")                       # needs tandem-trainer[export] (onnx, onnxscript)
        scripted = task.to_torchscript(method="trace")
    """

    @property
    def example_input_array(self) -> Any:
        """What forward() takes: a tensor (``model(x)``), a tuple (``model(*x)``) or a dict (``model(**x)``);
        used by the model summary, to_onnx and to_torchscript(method="trace")."""
        return self.__dict__.get("_example_input_array")

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self.__dict__["_example_input_array"] = example

    def freeze(self) -> Any:
        """Every parameter stops requiring gradients, and the task goes to eval mode (for inference)."""
        for p in self.parameters():  # type: ignore[attr-defined]
            p.requires_grad = False
        return self.eval()  # type: ignore[attr-defined]

    def unfreeze(self) -> Any:
        """Every parameter requires gradients again, and the task goes to training mode."""
        for p in self.parameters():  # type: ignore[attr-defined]
            p.requires_grad = True
        return self.train()  # type: ignore[attr-defined]

    def _example(self, given: Any, what: str) -> Any:
        """`given`, else example_input_array, through the batch-transfer hooks onto the task's device."""
        example = given if given is not None else self.example_input_array
        if example is None:
            raise ConfigError(
                f"{what} needs an input: pass one, or set self.example_input_array in {type(self).__name__}."
            )
        batch = self.on_before_batch_transfer(example, 0)  # type: ignore[attr-defined]
        batch = self.transfer_batch_to_device(batch, self.device, 0)  # type: ignore[attr-defined]
        return self.on_after_batch_transfer(batch, 0)  # type: ignore[attr-defined]

    @torch.no_grad()
    def to_onnx(
        self, file_path: str | os.PathLike[str] | Any = None, input_sample: Any = None, **kwargs: Any
    ) -> Any:
        """Export with ``torch.onnx.export(self, input_sample, file_path, **kwargs)`` (input_sample defaults to
        example_input_array); returns what it returns. Needs the `onnx` package (and `onnxscript` for the
        dynamo exporter, torch's default): ``pip install 'tandem-trainer[export]'``."""
        require("onnx", f"{type(self).__name__}.to_onnx()", "export")
        if kwargs.get("dynamo", True):
            require("onnxscript", f"{type(self).__name__}.to_onnx(dynamo=True)", "export")
        mode = self.training  # type: ignore[attr-defined]
        sample = self._example(input_sample, "to_onnx()")
        path = os.fspath(file_path) if isinstance(file_path, os.PathLike) else file_path
        try:
            return torch.onnx.export(self, sample, path, **kwargs)  # type: ignore[arg-type]
        finally:
            self.train(mode)  # type: ignore[attr-defined]

    @torch.no_grad()
    def to_torchscript(
        self,
        file_path: str | os.PathLike[str] | None = None,
        method: str | None = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> Any:
        """A ScriptModule of the task in eval mode, by ``torch.jit.script`` or ``torch.jit.trace`` (on
        example_inputs, else example_input_array); saved to `file_path` when given. Deprecated, as TorchScript
        is in torch (and in Lightning 2.6.6): export with ``torch.export.export`` or `to_onnx`."""
        rank_zero_deprecation(  # (frames: the helpers and their rank-zero wrapper, this method, no_grad's)
            f"{type(self).__name__}.to_torchscript() builds a TorchScript module, and torch deprecates "
            "TorchScript: export with torch.export.export(task, args) or task.to_onnx() instead.",
            stacklevel=7,
        )
        if method not in ("script", "trace"):
            raise ConfigError(f"to_torchscript(method=...) takes 'script' or 'trace', got {method!r}.")
        mode = self.training  # type: ignore[attr-defined]
        inputs = (
            self._example(example_inputs, "to_torchscript(method='trace')") if method == "trace" else None
        )
        try:
            with _scriptable(self):
                if method == "script":
                    module = torch.jit.script(self.eval(), **kwargs)  # type: ignore[attr-defined]
                else:
                    module = torch.jit.trace(func=self.eval(), example_inputs=inputs, **kwargs)  # type: ignore[attr-defined]
        finally:
            self.train(mode)  # type: ignore[attr-defined]
        if file_path is not None:
            from tandem_core.fileio import atomic_write

            atomic_write(file_path, lambda f: torch.jit.save(module, f))
        return module


@contextlib.contextmanager
def _scriptable(task: Any) -> Iterator[None]:
    """TorchScript compiles a module's properties unless listed in ``__jit_unused_properties__``; a Task's
    (trainer, device, hparams, ...) read the run, not tensors: list every property of the class outside
    torch's own, for as long as scripting runs. TorchScript still reads each attribute once, so meanwhile
    a property that raises (``trainer`` of an unattached task) answers None instead."""
    cls = type(task)
    props = {
        name: value
        for klass in reversed(cls.__mro__)
        if not klass.__module__.startswith("torch.")
        for name, value in vars(klass).items()
        if isinstance(value, property)
    }
    saved = {
        name: cls.__dict__[name] for name in [*props, "__jit_unused_properties__"] if name in cls.__dict__
    }
    unused = sorted(set(props) | set(getattr(cls, "__jit_unused_properties__", [])))
    for name, prop in props.items():
        setattr(cls, name, property(_or_none(prop.fget)))
    cls.__jit_unused_properties__ = unused  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name in [*props, "__jit_unused_properties__"]:
            if name in saved:
                setattr(cls, name, saved[name])
            else:
                delattr(cls, name)


def _or_none(fget: Any) -> Any:
    def get(self: Any) -> Any:
        try:
            return fget(self)
        except Exception:
            return None

    return get
