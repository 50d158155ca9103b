"""Building a run from its config: seed, callbacks, loggers, strategy and Trainer, then task and data.

The Trainer does not know about configs: this module builds it with plain keywords, sets its
``resolved_config`` and adds the SaveRunConfig callback that keeps the config with the run's logs.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tandem_core.errors import ConfigError, TandemError
from trainer.config.load import Source, load, resolve
from trainer.config.save import SaveRunConfig
from trainer.config.schema import FROM_TRAINER
from trainer.config.slots import slot_types
from trainer.config.targets import TARGET, built, instantiate, locate, params
from trainer.config.types import describe
from trainer.options import TrainerConfig
from trainer.secrets import env_values, redacted_errors

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.task.datamodule import DataModule
    from trainer.trainer import Trainer


@dataclass
class Run:
    """What a config builds: ``run.trainer.fit(run.task, datamodule=run.datamodule)``."""

    trainer: Trainer
    task: Task | None
    datamodule: DataModule | None
    config: dict[str, Any]


def build(
    source: Source | Sequence[Source] | None = None,
    overrides: Sequence[str] = (),
    *,
    with_task: bool = True,
    trainer_cls: type[Trainer] | None = None,
) -> Run:
    """Resolve the config, seed, build the callbacks, the loggers and the Trainer, then the task and data.

    `trainer_cls` builds a subclass of Trainer instead (it is given the same keywords).
    """
    raw = load(source, overrides)
    secrets = env_values(raw)  # written as ${oc.env:NAME}, never as the value (trainer/secrets.py)
    with redacted_errors():  # nor shown in an error message
        return _build_run(raw, secrets, with_task, trainer_cls)


def _build_run(raw: Any, secrets: dict[str, str], with_task: bool, trainer_cls: type[Trainer] | None) -> Run:
    cfg = resolve(raw)
    cfg["seed_everything"] = _pick_seed(cfg["seed_everything"])  # pinned: the saved config repeats it
    _seed(cfg)
    slots = slot_types()
    callbacks = [_build(c, f"callbacks[{i}]", slots["callbacks"]) for i, c in enumerate(cfg["callbacks"])]
    loggers = [_build(c, f"logger[{i}]", slots["logger"]) for i, c in enumerate(cfg["logger"])]
    kwargs = dict(cfg["trainer"], callbacks=[*callbacks, SaveRunConfig(cfg, secrets=secrets)])
    if loggers:
        kwargs["logger"] = loggers
    if kwargs.get("plugins"):  # before the strategy: Lightning's plugins, each checked to be one
        kwargs["plugins"] = [
            _build(p, f"trainer.plugins[{i}]", slots["plugins"]) for i, p in enumerate(kwargs["plugins"])
        ]
    if isinstance(kwargs["strategy"], dict):
        kwargs["strategy"] = _build_strategy(kwargs["strategy"], kwargs)
    try:
        trainer = (trainer_cls or _trainer_class())(**kwargs)
    except TandemError:
        raise
    except Exception as e:  # a subclass's own check, or a bug: name the section that built it
        raise ConfigError(f"trainer: building the Trainer failed: {type(e).__name__}: {e}") from e
    trainer.resolved_config, trainer.config_secrets = cfg, secrets
    run = Run(trainer, None, None, cfg)
    return build_task(run) if with_task else run


def build_trainer(
    source: Source | Sequence[Source], overrides: Sequence[str] = (), *, cls: type[Trainer] | None = None
) -> Trainer:
    """The Trainer of a config (its trainer, callbacks, logger and seed sections), without task or data."""
    return build(source, overrides, with_task=False, trainer_cls=cls).trainer


def build_task(run: Run) -> Run:
    """Build the task and data of `run.config` into `run`, seeded afresh so that the task's initial
    weights depend on the seed only. The command calls it inside ``strategy.launch``: a process that only
    launches workers never builds them."""
    cfg, slots = run.config, slot_types()
    if cfg["task"] is None:
        raise ConfigError("the config has no task section; add task: {_target_: your.module.YourTask, ...}")
    _seed(cfg)
    run.task = _build(cfg["task"], "task", slots["task"])
    from trainer.config.optim import attach  # here, not at the top: a smaller merge with the secrets work

    attach(run.task, cfg.get("optimizer"), cfg.get("lr_scheduler"))  # LightningCLI's sections, if given
    if cfg["data"] is not None:
        run.datamodule = _build(cfg["data"], "data", slots["data"])
    return run


def _trainer_class() -> type[Trainer]:
    """trainer.trainer.Trainer, imported on first use: the config layer sits above the Trainer, which
    never imports it, and `import trainer.config` does not load the Trainer."""
    from trainer.trainer import Trainer

    return Trainer


def _seed(cfg: dict[str, Any]) -> None:
    if cfg["seed_everything"] is not None:
        from trainer.seed import seed_everything

        seed_everything(cfg["seed_everything"], workers=True)


def _build_strategy(node: dict[str, Any], options: dict[str, Any]) -> Any:
    """A strategy _target_ entry, given accelerator, devices and num_nodes from the trainer section."""
    defaults = TrainerConfig.defaults()
    for name in FROM_TRAINER:
        value = options[name]
        if name in node and value != defaults[name] and node[name] != value:
            raise ConfigError(
                f"trainer.strategy.{name}={node[name]!r} disagrees with trainer.{name}={value!r}; "
                f"set {name} in the trainer section only"
            )
        if name in node and value == defaults[name]:
            options[name] = node[
                name
            ]  # the Trainer gets the entry's value, not its own default, to agree with
    accepts = {p.name for p in params(locate(node[TARGET])) or []}
    if "devices" in accepts and "devices" not in node and options["devices"] == "auto":
        raise ConfigError(
            f"trainer.strategy: {node[TARGET]} takes its devices from trainer.devices, which is 'auto'; "
            "set trainer.devices to a number"
        )
    inject = {name: options[name] for name in FROM_TRAINER}  # the entry's own values win (instantiate)
    if "devices" in inject:  # Lightning's forms ("0,1", [0, 1], -1) as the count a strategy takes
        from trainer.devices import count

        inject["devices"] = count(inject["devices"], options.get("accelerator", "auto"))
    return _build(node, "trainer.strategy", slot_types()["strategy"], inject)


def _build(node: dict[str, Any], where: str, kind: type, inject: dict[str, Any] | None = None) -> Any:
    """Build a slot's entry: its target is checked to be a `kind` before it is called, and so is the result."""
    return built(instantiate(node, where, expected=kind, inject=inject), kind, where, describe(kind))


def _pick_seed(value: Any) -> int | None:
    """seed_everything: an int as given; true picks one, the same in every process of a distributed run."""
    if value is True:
        env = os.environ
        if "RANK" in env:  # a worker: agree with the others without talking to them
            if env.get("TANDEM_GLOBAL_SEED", "").isdigit():  # chosen by the process that launched us
                return int(env["TANDEM_GLOBAL_SEED"]) % 2**32
            basis = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or env.get("MASTER_PORT", "")
            return zlib.crc32(basis.encode())
        return random.SystemRandom().randrange(2**32)
    return None if value is None or value is False else int(value)
