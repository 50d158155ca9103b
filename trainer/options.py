"""TrainerConfig: the one definition of every Trainer option: its name, type, default, doc and check.

`Trainer(**options)` takes its signature, its docstring and its validation from here, and the config
layer (trainer/config/schema.py) its schema of the ``trainer:`` section. Example::

    cfg = TrainerConfig.from_kwargs(max_epochs=3, precision="bf16-mixed")  # ConfigError if wrong
    cfg.effective().max_epochs  # the values a run uses (fast_dev_run applied, max_epochs filled in)
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import typing
from collections.abc import Callable, Iterable, Mapping, MutableSequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from tandem_core.errors import did_you_mean
from tandem_core.fileio import is_url

if TYPE_CHECKING:
    from datetime import timedelta

    from callbacks.base import Callback
    from strategies.base import Strategy
    from trainer.loggers import Logger
    from trainer.profilers.base import Profiler

    Plugin = Any  # (the Union of the plugin kinds, strategies/plugins.py:plugin_type, given to signature())

from trainer.option_checks import (  # noqa: F401 (OptionError is part of this module's interface)
    FLAG,
    LIMIT,
    OptionError,
    OptionTypeError,
    check_accelerator,
    check_callbacks,
    check_clip_val,
    check_devices,
    check_duration,
    check_logger,
    check_model_registry,
    check_plugins,
    check_precision,
    check_profiler,
    check_strategy,
    check_val_interval,
    choice,
    finite_at_least_0,
    int_from,
    is_int,
    is_text,
    must,
)


def option(default: Any, doc: str, check: Callable[[str, Any], None]) -> Any:
    """A TrainerConfig field: its default, its one-line doc and its check."""
    return field(default=default, metadata={"doc": doc, "check": check})


#: options whose None means their default, as in Lightning's Trainer signature
NONE_IS_DEFAULT = (
    "precision",
    "logger",
    "limit_train_batches",
    "limit_val_batches",
    "limit_test_batches",
    "limit_predict_batches",
    "val_check_interval",
    "num_sanity_val_steps",
    "log_every_n_steps",
    "enable_checkpointing",
    "enable_progress_bar",
    "enable_model_summary",
)

#: options that count batches (int) or take a fraction (float), read as Lightning's _determine_batch_limits
BATCH_COUNTS = (
    "limit_train_batches",
    "limit_val_batches",
    "limit_test_batches",
    "limit_predict_batches",
    "overfit_batches",
    "val_check_interval",
)


# ----- the options ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainerConfig:
    """Every Trainer option (Lightning 2.x names and meanings), validated when it is made."""

    accelerator: str = option("auto", "'auto', 'cpu', 'cuda' (or 'gpu'), 'mps'", check_accelerator)
    strategy: str | Strategy = option(
        "auto",
        "'auto', 'single', 'dp', 'ddp', 'fsdp', Lightning's names (docs/porting.md), or a Strategy instance",
        check_strategy,
    )
    devices: int | str | list[int] = option(
        "auto",
        "devices (processes for ddp, replicas for dp): a count, -1 (all GPUs), 'auto', or GPU indices "
        "('0,1', [0, 1]); trainer/devices.py",
        check_devices,
    )
    num_nodes: int = option(1, "machines in a ddp run", must(int_from(1), "an int >= 1"))
    precision: str | int | None = option(
        "32-true",
        "'32-true', '64-true', 'bf16-mixed', '16-mixed', 'bf16-true', '16-true' (or 32, 64, 'bf16', 16)",
        check_precision,
    )
    logger: bool | Logger | list[Logger] | None = option(
        True, "True or None (TensorBoard), False, a Logger or a list of them", check_logger
    )
    callbacks: Callback | list[Callback] | None = option(
        None, "a Callback or a list of them", check_callbacks
    )
    fast_dev_run: bool | int = option(
        False,
        "True or n: run n (1) batches of train and val, no logging or checkpoints",
        must(lambda v: isinstance(v, bool) or int_from(0)(v), "a bool or an int >= 0"),
    )
    max_epochs: int | None = option(
        None,
        "stop after this many epochs; None: 1000, or no limit when max_steps is set; -1: no limit",
        must(int_from(-1, none=True), "an int >= -1 (-1 for no limit)"),
    )
    min_epochs: int | None = option(
        None,
        "do not stop early before this many epochs",
        must(int_from(0, none=True), "an int >= 0 or None"),
    )
    max_steps: int = option(
        -1, "stop after this many optimizer steps; -1: no limit", must(int_from(-1), "an int >= -1")
    )
    min_steps: int | None = option(
        None,
        "do not stop early before this many optimizer steps",
        must(int_from(0, none=True), "an int >= 0 or None"),
    )
    max_time: str | float | dict[str, float] | timedelta | None = option(
        None,
        "stop training after this long: 'DD:HH:MM:SS', a timedelta, a mapping or seconds",
        check_duration,
    )
    limit_train_batches: int | float | None = option(
        1.0, "int: batches per epoch; float: fraction of the loader", LIMIT
    )
    limit_val_batches: int | float | None = option(1.0, "the same for validation", LIMIT)
    limit_test_batches: int | float | None = option(1.0, "the same for test", LIMIT)
    limit_predict_batches: int | float | None = option(1.0, "the same for predict", LIMIT)
    val_check_interval: int | float | str | dict[str, float] | timedelta | None = option(
        1.0,
        "float: validate every fraction of a training epoch; int: every n training batches; a duration "
        "('DD:HH:MM:SS', a timedelta or its keywords): once that much wall time has passed",
        check_val_interval,
    )
    check_val_every_n_epoch: int | None = option(
        1,
        "validate in every n-th epoch; None: in every epoch",
        must(int_from(1, none=True), "an int >= 1 or None"),
    )
    num_sanity_val_steps: int | None = option(
        2,
        "validation batches run before training to catch bugs early; -1: all",
        must(int_from(-1), "an int >= -1 (-1 runs all)"),
    )
    log_every_n_steps: int | None = option(
        50,
        "write training metrics every n optimizer steps; 0: never (epoch metrics still)",
        must(int_from(0), "an int >= 0"),
    )
    enable_checkpointing: bool | None = option(
        True, "add a default ModelCheckpoint unless one is given", FLAG
    )
    enable_progress_bar: bool | None = option(True, "show the progress bar (rank 0)", FLAG)
    enable_model_summary: bool | None = option(
        True, "print the table of the task's modules at the start", FLAG
    )
    accumulate_grad_batches: int = option(
        1,
        "micro-batches per optimizer step; only the last one communicates",
        must(int_from(1), "an int >= 1"),
    )
    gradient_clip_val: float | None = option(
        None,
        "clip gradients to this value (after unscaling); None: no clipping",
        check_clip_val,
    )
    gradient_clip_algorithm: str | None = option(
        None,
        "'norm' (total 2-norm) or 'value' (each element); None: 'norm' (Lightning's default)",
        choice(("norm", "value"), none=True),
    )
    deterministic: bool | str | None = option(
        None,
        "True, False, 'warn' or None (leave torch's setting)",
        must(lambda v: v is None or isinstance(v, bool) or is_text(v, "warn"), "True, False, 'warn' or None"),
    )
    use_distributed_sampler: bool = option(True, "inject a DistributedSampler into loaders under ddp", FLAG)
    default_root_dir: str | os.PathLike[str] | None = option(
        None,
        "where logs and checkpoints go (None: the working directory)",
        must(
            lambda v: v is None or (isinstance(v, (str, os.PathLike)) and not is_url(v)),
            "a local path or None",
        ),
    )
    resume: str | None = option(
        None,
        "'auto': fit continues from the newest last.ckpt of this run directory, if there is one",
        must(lambda v: v is None or is_text(v, "auto"), "None or 'auto'"),
    )
    detect_nonfinite: str = option(
        "off",
        "'raise', 'skip' or 'off': what a NaN/inf training loss does",
        choice(("off", "raise", "skip")),
    )

    stop_grace_s: float = option(
        20.0,
        "after SIGINT/SIGTERM, the least time a rank has to reach the agreed stop (grows with measured step time)",
        must(lambda v: finite_at_least_0(v) and v > 0, "a number > 0"),
    )
    compile: bool | dict[str, Any] = option(
        False,
        "torch.compile the task once the strategy has set it up: True, or a dict of torch.compile's keywords",
        must(
            lambda v: isinstance(v, bool) or (isinstance(v, dict) and all(isinstance(k, str) for k in v)),
            "true, false or a dict of torch.compile keywords",
        ),
    )
    # ----- Lightning keywords beyond the loop's basics -----
    benchmark: bool | None = option(
        None,
        "cudnn.benchmark for the run (None: off when deterministic, else leave it)",
        must(lambda v: v is None or isinstance(v, bool), "true, false or None"),
    )
    sync_batchnorm: bool = option(False, "ddp/fsdp: BatchNorm statistics over the global batch", FLAG)
    profiler: str | Profiler | None = option(
        None,
        "None, 'simple' (time per hook and step phase), 'advanced' (torch.profiler table) or 'pytorch' "
        "(torch.profiler traces for TensorBoard), or a profiler of trainer/profiler.py",
        check_profiler,
    )
    overfit_batches: int | float = option(
        0.0, "train and validate on the same first n batches (or fraction), unshuffled; 0: off", LIMIT
    )
    inference_mode: bool = option(True, "evaluate under torch.inference_mode (False: torch.no_grad)", FLAG)
    detect_anomaly: bool = option(False, "torch.autograd's anomaly detection during fit", FLAG)
    reload_dataloaders_every_n_epochs: int = option(
        0,
        "ask train_dataloader()/val_dataloader() again every n epochs; 0: never",
        must(int_from(0), "an int >= 0"),
    )
    barebones: bool = option(
        False, "no logger, checkpointing, progress bar, summary or sanity check; self.log is an error", FLAG
    )
    enable_autolog_hparams: bool = option(
        True,
        "write the task's (and DataModule's) hyperparameters to the loggers when each stage starts",
        FLAG,
    )
    model_registry: str | None = option(
        None,
        "Lightning's model-hub upload; only None (Tandem has no model registry)",
        check_model_registry,
    )
    plugins: Plugin | list[Plugin] | None = option(
        None,
        "None, or Lightning's plugins (trainer.plugins): a precision plugin, a cluster environment, a checkpoint IO (AsyncCheckpointIO(), ...), "
        "a layer sync; one of each kind at most",
        check_plugins,
    )

    def __post_init__(self) -> None:
        for name in NONE_IS_DEFAULT:  # Lightning's signature defaults these to None, meaning its default
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.__dataclass_fields__[name].default)
        logger = self.logger  # Lightning takes any iterable of loggers (a generator too): kept as a list
        if not isinstance(logger, (bool, list, tuple, str)) and hasattr(logger, "__iter__"):
            object.__setattr__(self, "logger", list(logger))
        for name in BATCH_COUNTS:  # as Lightning: a whole float above 1 (5.0) counts batches (5)
            value = getattr(self, name)
            if isinstance(value, float) and value > 1 and value.is_integer():
                object.__setattr__(self, name, int(value))
        for f in fields(self):
            f.metadata["check"](f.name, getattr(self, f.name))

    # ----- construction --------------------------------------------------------------------------
    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> TrainerConfig:
        """The options `kwargs` names (the others at their defaults); an OptionError if one is wrong."""
        cls.check_names(kwargs)
        # a list-like container (omegaconf's ListConfig from Trainer(**OmegaConf.create(...))) as the list it holds
        return cls(**{k: list(v) if isinstance(v, MutableSequence) and not isinstance(v, list) else v
                      for k, v in kwargs.items()})  # fmt: skip

    @classmethod
    def check_names(cls, names: Iterable[str]) -> None:
        """Raise an OptionError for the first name that is no option, suggesting the closest one."""
        valid = cls.names()
        for name in names:
            if name not in valid:
                hint = did_you_mean(str(name), valid)
                raise OptionTypeError(  # a TypeError too: Python's for an unknown keyword
                    str(name),
                    f"unknown Trainer option {name!r}{hint} (every option: docs/configuration.md)",
                    hint,
                    unknown=True,
                )

    @classmethod
    def coerce(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """`options` with strings (from YAML, the command line, ``${oc.env:...}``) turned into the bool,
        int or float their option's type names, where they read as one; everything else as given."""
        types = {f.name: [t.strip() for t in str(f.type).split("|")] for f in fields(cls)}
        return {k: _from_text(v, types[k]) if k in types else v for k, v in options.items()}

    def effective(self) -> TrainerConfig:
        """The values a run uses: fast_dev_run's limits applied and max_epochs' None filled in."""
        changes: dict[str, Any] = {}
        if self.fast_dev_run:
            n = 1 if self.fast_dev_run is True else int(self.fast_dev_run)
            changes.update(max_epochs=1, max_steps=n, num_sanity_val_steps=0, val_check_interval=1.0)
            changes.update(check_val_every_n_epoch=1)
            changes.update(limit_train_batches=n, limit_val_batches=n, limit_test_batches=n)
            changes.update(limit_predict_batches=n, logger=False, enable_checkpointing=False)
            changes.update(fast_dev_run=True if n == 1 else n)  # 1 reads back as True (Lightning's)
        if self.barebones:
            changes.update(logger=False, enable_checkpointing=False, enable_progress_bar=False)
            changes.update(enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=0)
        if self.overfit_batches:
            changes.update(limit_train_batches=self.overfit_batches, limit_val_batches=self.overfit_batches)
        max_epochs = changes.get("max_epochs", self.max_epochs)
        if max_epochs is None:
            changes["max_epochs"] = 1000 if changes.get("max_steps", self.max_steps) == -1 else -1
        return dataclasses.replace(self, **changes) if changes else self

    # ----- description ---------------------------------------------------------------------------
    @classmethod
    def names(cls) -> list[str]:
        """Every option's name, in the order of this class."""
        return [f.name for f in fields(cls)]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every option with its default, in the order of this class."""
        return {f.name: f.default for f in fields(cls)}

    @classmethod
    def signature(cls, first: str | None = None, names: dict[str, Any] | None = None) -> inspect.Signature:
        """Keyword-only parameters with defaults (None for NONE_IS_DEFAULT, as Lightning's signature: a tool that
        passes every default, LightningCLI, then sets none of them) and annotations; `first` ("self") puts a positional
        parameter in front, as ``Trainer.__init__.__signature__`` needs. With `names` (the classes the
        annotations name: Strategy, Logger, Callback, Profiler, Plugin, timedelta) the annotations are types, not text, so
        that tools reading the signature (LightningCLI's jsonargparse) know what each option takes."""
        types = typing.get_type_hints(cls, localns=names) if names is not None else {}
        params = [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if f.name in NONE_IS_DEFAULT else f.default,  # Lightning's: None, its default
                annotation=types.get(f.name, f.type),
            )
            for f in fields(cls)
        ]
        if first is None:
            return inspect.Signature(params)
        head = inspect.Parameter(first, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return inspect.Signature([head, *params], return_annotation="None")

    @classmethod
    def docstring(cls) -> str:
        """One list item per option (``- `name` (type) = default: doc``), for ``Trainer.__init__.__doc__`` (help()
        and the API reference show it)."""
        lines = [f"- `{f.name}` ({f.type}) = `{f.default!r}`: {f.metadata['doc']}" for f in fields(cls)]
        return "Configure a run; every option is keyword-only (trainer/options.py):\n\n" + "\n".join(lines)


def _from_text(value: Any, types: list[str]) -> Any:
    """A string read as the first of bool, int, float that `types` allows and that parses it."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if "bool" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        if kind.__name__ in types:
            try:
                return kind(text)
            except ValueError:
                pass
    return value
