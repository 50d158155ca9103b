"""TrainerConfig: the one typed list of Trainer options, checked by Trainer.__init__ and by the config loader."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from trainer.errors import ConfigError, choose


@dataclass
class TrainerConfig:
    """Every Trainer keyword with its default (Lightning 2.x names and meanings)."""

    accelerator: str = "auto"  # "auto", "cpu", "cuda"/"gpu", "mps"
    strategy: Any = "auto"  # "auto", "single", "dp", "ddp", "ddp_accumulate", or a Strategy instance
    devices: Any = "auto"  # number of devices (processes for ddp, replicas for dp) or "auto"
    num_nodes: int = 1
    precision: Any = "32-true"  # "32-true", "64-true", "bf16-mixed", "16-mixed" (or 32, 64, "bf16", 16)
    logger: Any = True  # True (TensorBoard), False, a Logger, or a list of them
    callbacks: Any = None  # a Callback or a list of them
    fast_dev_run: Any = False  # True or n: run n (1) batches of train and val, no logging or checkpoints
    max_epochs: Any = None  # None means 1000 unless max_steps is set; -1 means no limit
    min_epochs: Any = None
    max_steps: int = -1  # optimizer steps; -1 means no limit
    min_steps: Any = None
    max_time: Any = None  # "DD:HH:MM:SS", a timedelta, a dict or seconds: stop training after it (a Timer)
    limit_train_batches: Any = 1.0  # int: batches per epoch; float: fraction of the loader
    limit_val_batches: Any = 1.0
    limit_test_batches: Any = 1.0
    limit_predict_batches: Any = 1.0
    val_check_interval: Any = 1.0  # float: fraction of the training epoch; int: every n training batches
    check_val_every_n_epoch: Any = 1
    num_sanity_val_steps: int = 2  # validation batches run before training to catch bugs early
    log_every_n_steps: int = 50
    enable_checkpointing: bool = True
    enable_progress_bar: bool = True
    enable_model_summary: bool = True
    accumulate_grad_batches: int = 1  # micro-batches per optimizer step; only the last one communicates
    gradient_clip_val: Any = None
    gradient_clip_algorithm: str = "norm"  # "norm" or "value"
    deterministic: Any = None  # True, False, "warn" or None (leave torch's setting)
    use_distributed_sampler: bool = True  # inject a DistributedSampler into loaders under ddp
    default_root_dir: Any = None  # where logs and checkpoints go (default: the working directory)
    resume: Any = None  # "auto": continue from the newest last.ckpt of this run directory, if there is one
    detect_nonfinite: str = "off"  # "raise", "skip" or "off": what a NaN/inf training loss does (checks sync)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the option and what to change."""

        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        check(
            self.max_epochs is None or (is_int(self.max_epochs) and self.max_epochs >= -1),
            f"max_epochs must be an int >= -1 (-1 for no limit), got {self.max_epochs!r}",
        )
        check(
            is_int(self.max_steps) and self.max_steps >= -1,
            f"max_steps must be an int >= -1, got {self.max_steps!r}",
        )
        check(
            is_int(self.accumulate_grad_batches) and self.accumulate_grad_batches >= 1,
            f"accumulate_grad_batches must be an int >= 1, got {self.accumulate_grad_batches!r}",
        )
        check(
            is_int(self.log_every_n_steps) and self.log_every_n_steps >= 1,
            f"log_every_n_steps must be an int >= 1, got {self.log_every_n_steps!r}",
        )
        check(
            is_int(self.num_sanity_val_steps) and self.num_sanity_val_steps >= -1,
            f"num_sanity_val_steps must be an int >= -1 (-1 runs all), got {self.num_sanity_val_steps!r}",
        )
        check(
            is_int(self.num_nodes) and self.num_nodes >= 1,
            f"num_nodes must be an int >= 1, got {self.num_nodes!r}",
        )
        check(
            self.devices == "auto" or (is_int(self.devices) and self.devices >= 1),
            f"devices must be an int >= 1 or 'auto', got {self.devices!r}",
        )
        for name in (
            "limit_train_batches",
            "limit_val_batches",
            "limit_test_batches",
            "limit_predict_batches",
        ):
            v = getattr(self, name)
            check(
                (is_int(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v <= 1.0),
                f"{name} must be an int >= 0 (batches) or a float in [0, 1] (fraction), got {v!r}",
            )
        v = self.val_check_interval
        check(
            (is_int(v) and v >= 1) or (isinstance(v, float) and 0.0 < v <= 1.0),
            f"val_check_interval must be an int >= 1 (batches) or a float in (0, 1], got {v!r}",
        )
        check(
            self.check_val_every_n_epoch is None
            or (is_int(self.check_val_every_n_epoch) and self.check_val_every_n_epoch >= 1),
            f"check_val_every_n_epoch must be an int >= 1 or None, got {self.check_val_every_n_epoch!r}",
        )
        check(
            self.gradient_clip_val is None
            or (isinstance(self.gradient_clip_val, (int, float)) and self.gradient_clip_val >= 0),
            f"gradient_clip_val must be a number >= 0 or None, got {self.gradient_clip_val!r}",
        )
        choose("gradient_clip_algorithm", self.gradient_clip_algorithm, ("norm", "value"))
        check(
            self.deterministic in (None, True, False, "warn"),
            f"deterministic must be True, False, 'warn' or None, got {self.deterministic!r}",
        )
        check(
            isinstance(self.fast_dev_run, bool) or (is_int(self.fast_dev_run) and self.fast_dev_run >= 0),
            f"fast_dev_run must be a bool or an int >= 0, got {self.fast_dev_run!r}",
        )
        # the options below also arrive from YAML files and CLI overrides (trainer/config.py), so their
        # types are checked here too: a typo like enable_checkpointing=flase must not read as True
        check(
            isinstance(self.accelerator, str),
            f"accelerator must be a string ('auto', 'cpu', 'cuda', 'gpu', 'mps'), got {self.accelerator!r}",
        )
        if isinstance(self.accelerator, str):
            choose("accelerator", self.accelerator, ("auto", "cpu", "cuda", "gpu", "mps"))
        bools = ("enable_checkpointing", "enable_progress_bar", "enable_model_summary")
        for name in (*bools, "use_distributed_sampler"):
            v = getattr(self, name)
            check(isinstance(v, bool), f"{name} must be true or false, got {v!r}")
        for name in ("min_epochs", "min_steps"):
            v = getattr(self, name)
            check(v is None or (is_int(v) and v >= 0), f"{name} must be an int >= 0 or None, got {v!r}")
        check(
            self.default_root_dir is None or isinstance(self.default_root_dir, (str, os.PathLike)),
            f"default_root_dir must be a path (a string) or None, got {self.default_root_dir!r}",
        )

        check(self.resume in (None, "auto"), f"resume must be None or 'auto', got {self.resume!r}")
        choose("detect_nonfinite", str(self.detect_nonfinite), ("off", "raise", "skip"))

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> TrainerConfig:
        """Validated options with fast_dev_run and the max_epochs default applied (temporary; see h-config)."""
        from trainer.errors import did_you_mean

        for key in kwargs:
            if key not in cls.names():
                raise ConfigError(f"Trainer got an unknown keyword {key!r}{did_you_mean(key, cls.names())}")
        cfg = cls(**kwargs)
        if cfg.fast_dev_run:
            n = 1 if cfg.fast_dev_run is True else int(cfg.fast_dev_run)
            cfg.max_epochs, cfg.max_steps, cfg.num_sanity_val_steps = 1, n, 0
            cfg.limit_train_batches = cfg.limit_val_batches = cfg.limit_test_batches = n
            cfg.limit_predict_batches, cfg.val_check_interval = n, 1.0
            cfg.logger, cfg.enable_checkpointing = False, False
        if cfg.max_epochs is None:
            cfg.max_epochs = 1000 if cfg.max_steps == -1 else -1
        return cfg

    @classmethod
    def signature(cls) -> Any:
        import inspect

        kw = inspect.Parameter.KEYWORD_ONLY
        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
        params += [inspect.Parameter(f.name, kw, default=f.default) for f in fields(cls)]
        return inspect.Signature(params)
