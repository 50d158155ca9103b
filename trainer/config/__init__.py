"""Run configs: YAML files + ``key=value`` overrides -> one validated, resolved dict -> Trainer, Task, data.

Example::

    run = build("examples/configs/digits.yaml", ["trainer.max_epochs=3", "task.lr=0.05"])
    run.trainer.fit(run.task, datamodule=run.datamodule)
    trainer = build_trainer("examples/configs/digits.yaml")  # the Trainer only (trainer, callbacks, logger)

Sections (docs/configuration.md): ``seed_everything``, ``trainer`` (the options of trainer/options.py),
``task`` and ``data`` (``_target_`` import path + arguments), ``optimizer`` and ``lr_scheduler`` (LightningCLI's
automatic configure_optimizers), ``callbacks`` and ``logger`` (lists of ``_target_`` entries), ``ckpt_path``.
A LightningCLI config (``model:``, ``class_path``/``init_args``) is read into them (trainer/config/lightning_form.py). Interpolation (``${trainer.default_root_dir}``, ``${oc.env:VAR,default}``) is
omegaconf's. Every mistake is a ConfigError that names the key and says what to change.

This module gathers the layer's public names; the work is done in
trainer/config/load.py (files, overrides, interpolation), trainer/config/schema.py (validation),
trainer/config/targets.py (``_target_`` import and call), trainer/config/types.py (what each slot or
parameter may build, checked before anything is called), trainer/config/build.py (Trainer, task, data)
and trainer/config/save.py (YAML out, the SaveRunConfig callback).
"""

from __future__ import annotations

from trainer.config.build import Run, build, build_task, build_trainer
from trainer.config.load import Source, load, resolve
from trainer.config.save import SaveRunConfig, save, to_yaml
from trainer.config.schema import FROM_TRAINER, SECTIONS, validate
from trainer.config.targets import PARTIAL, TARGET, instantiate, locate

__all__ = [
    "FROM_TRAINER",
    "PARTIAL",
    "SECTIONS",
    "TARGET",
    "Run",
    "SaveRunConfig",
    "Source",
    "build",
    "build_task",
    "build_trainer",
    "instantiate",
    "load",
    "locate",
    "resolve",
    "save",
    "to_yaml",
    "validate",
]
