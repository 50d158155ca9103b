"""PyTorchProfiler: torch.profiler over each stage (Lightning's ``profiler="pytorch"``): a table of operator times
as the report, and a trace for TensorBoard's profiler plugin."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tandem_core.errors import ConfigError
from trainer.profilers.simple import SimpleProfiler


class PyTorchProfiler(SimpleProfiler):
    """torch.profiler over each stage, its trace written for TensorBoard's profiler plugin (torch's
    tensorboard_trace_handler, when `export_to_chrome`) into `dirpath` (default: the run's log_dir), one file per
    rank and stage; the report is torch's table of operator times (`row_limit` rows sorted by `sort_by_key`,
    grouped by input shapes with `group_by_input_shapes`, `table_kwargs` for the rest of ``EventList.table``).
    `profiler_kwargs` go to ``torch.profiler.profile`` (``record_shapes``, ``profile_memory``, ``with_stack``,
    ``schedule``, ...). `record_module_names`: each submodule's forward is a named range
    (``[pl][module]<class>: <name>``)."""

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        group_by_input_shapes: bool = False,
        emit_nvtx: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        record_module_names: bool = True,
        table_kwargs: dict[str, Any] | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        if emit_nvtx:
            raise ConfigError(
                "PyTorchProfiler(emit_nvtx=True) is for NVIDIA's nsys and is not supported by Tandem; run the "
                "script under `nsys profile` with torch.autograd.profiler.emit_nvtx yourself"
            )
        super().__init__(dirpath, filename)
        self.group_by_input_shapes = group_by_input_shapes and bool(
            profiler_kwargs.get("record_shapes", False)
        )
        self.export_to_chrome, self.row_limit, self.record_module_names = (
            export_to_chrome,
            row_limit,
            record_module_names,
        )
        self.sort_by_key = sort_by_key or "cpu_time_total"
        self._table_kwargs = _check_table_kwargs(table_kwargs or {})
        accepted = set(inspect.signature(torch.profiler.profile).parameters)
        unknown = sorted(set(profiler_kwargs) - accepted)
        if unknown:
            raise ConfigError(
                f"PyTorchProfiler: {', '.join(unknown)} are not arguments of torch.profiler.profile (its arguments: "
                f"{', '.join(sorted(accepted))})"
            )
        self._profiler_kwargs = profiler_kwargs
        self.trace_dirs: list[str] = []  # where each stage's trace went
        self._torch: Any = None
        self.function_events: Any = None  # torch.profiler's events of the last stage
        self._module_names: RegisterRecordFunction | None = None
        self._ranges: dict[str, Any] = {}  # the record_function ranges started by `start`

    def attach(self, trainer: Any) -> None:
        """A stage starts: torch.profiler runs until the report (`summary`)."""
        import torch.profiler

        self._torch = torch.profiler.profile(**self._profile_kwargs(trainer))
        self._torch.__enter__()

    def start(self, action_name: str) -> None:
        """Time `action_name` as a torch.profiler range; used on its own (no Trainer), the first start begins
        torch.profiler."""
        import torch.profiler

        if self._torch is None:
            self.attach(None)
        super().start(action_name)
        self._ranges[action_name] = torch.profiler.record_function(f"[pl][profile]{action_name}").__enter__()

    def stop(self, action_name: str) -> None:
        super().stop(action_name)
        self._ranges.pop(action_name).__exit__(None, None, None)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        import torch.profiler

        with (
            torch.profiler.record_function(f"[pl][profile]{name}"),
            super().section(name),
        ):  # Lightning's names
            yield

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # torch.profiler, its open ranges and hooks stay with this object
        state.update(_torch=None, _ranges={}, _module_names=None)
        return state

    def summary(self) -> str:
        for name in list(self._ranges):  # an action still open (started, never stopped) ends with the report
            self._ranges.pop(name).__exit__(None, None, None)
        if self._module_names is not None:
            self._module_names.__exit__(None, None, None)
            self._module_names = None
        if self._torch is not None:  # the stage's end: torch.profiler stops, its events stay for the report
            self._torch.__exit__(None, None, None)
            self.function_events = self._torch.events()
            self._torch = None
        if self.function_events is None:
            return super().summary()
        table = self._table(self.function_events)
        title = f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"
        return f"{title}\n{table}"

    def _profile_kwargs(self, trainer: Any) -> dict[str, Any]:
        import os

        from torch.profiler import tensorboard_trace_handler

        kwargs = dict(self._profiler_kwargs)
        if self.record_module_names and trainer is not None and getattr(trainer, "task", None) is not None:
            self._module_names = RegisterRecordFunction(trainer.task).__enter__()
        if not self.export_to_chrome:
            return kwargs
        stage = (
            getattr(getattr(trainer, "state", None), "entry", None) or self._stage or "stage"
        )  # fit, validate, test, predict

        def write(prof: Any) -> None:  # at the stage's end, when every rank knows the run's log_dir
            root = self.dirpath or (trainer.log_dir if trainer is not None else os.getcwd())
            rank = trainer.global_rank if trainer is not None else 0
            folder = os.path.join(str(root), stage)
            self.trace_dirs.append(folder)
            tensorboard_trace_handler(folder, worker_name=f"rank{rank}")(prof)

        return {**kwargs, "on_trace_ready": write}

    def _table(self, events: Any) -> str:
        averages = events.key_averages(group_by_input_shapes=self.group_by_input_shapes)
        return averages.table(sort_by=self.sort_by_key, row_limit=self.row_limit, **self._table_kwargs)


def _check_table_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`table_kwargs` for torch's ``EventList.table`` (a KeyError naming a wrong key, as Lightning's)."""
    from torch.autograd.profiler_util import EventList

    valid = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
    for key in kwargs:
        if key in ("sort_by", "row_limit"):
            raise KeyError(
                f"table_kwargs cannot hold {key!r}: pass it as PyTorchProfiler(sort_by_key=..., row_limit=...)"
            )
        if key not in valid:
            raise KeyError(
                f"table_kwargs key {key!r} is no argument of torch's EventList.table ({sorted(valid)})"
            )
    return kwargs


class RegisterRecordFunction:
    """Inside ``with RegisterRecordFunction(model):`` each submodule's forward is a torch.profiler range named
    ``[pl][module]<module>.<class>: <name>`` (PyTorchProfiler(record_module_names=True) does this for the task)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._handles: list[Any] = []

    def __enter__(self) -> RegisterRecordFunction:
        from torch.autograd.profiler import record_function

        for name, module in self.model.named_modules():
            if not name:
                continue
            label = f"[pl][module]{type(module).__module__}.{type(module).__name__}: {name}"
            ranges: list[Any] = []

            def enter(_m: Any, _a: Any, label: str = label, ranges: list[Any] = ranges) -> None:
                ranges.append(record_function(label).__enter__())

            def leave(_m: Any, _a: Any, _o: Any, ranges: list[Any] = ranges) -> None:
                if ranges:
                    ranges.pop().__exit__(None, None, None)

            self._handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
