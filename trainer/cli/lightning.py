"""LightningCLI: a project's ``main.py`` that is a command line over its Task, DataModule and the Trainer,
with Lightning 2.6's signature and behaviour. A Lightning project changes its imports only::

    from trainer.cli import LightningCLI            # was: from lightning.pytorch.cli import LightningCLI
    LightningCLI(MyModel, MyDataModule)             # python main.py fit --config config.yaml --trainer.max_epochs=3

Subcommands fit/validate/test/predict (each takes its Trainer method's arguments: ``--ckpt_path``, ...),
``--config`` (several merge), ``--print_config``, ``--help``; ``run=False`` builds without running. Values are
parsed by jsonargparse (the `cli` extra) from the classes' signatures; before anything is built, every class
and callable they name is checked against Tandem's trust rules (trainer/cli/trust.py). Lightning's own class
paths in a config (``lightning.pytorch.callbacks.EarlyStopping``) name Tandem's classes.
"""

from __future__ import annotations

import inspect
import os
import random
import sys
import warnings
from functools import partial
from typing import Any

import torch
import yaml

from trainer.cli.instantiate import CliInstantiator, module_type, saved_classes_imported
from trainer.cli.optimizers import AUTOMATIC, attach_automatic, class_path_dict
from trainer.cli.parser import LightningArgumentParser, tandem_paths
from trainer.cli.save import SaveConfigCallback
from trainer.cli.types import LRSchedulerTypeTuple
from trainer.config.optim import ReduceLROnPlateau
from trainer.seed import seed_everything
from trainer.task.base import Task
from trainer.task.datamodule import DataModule
from trainer.trainer import Trainer


class LightningCLI:
    """Lightning's LightningCLI on Tandem's Trainer (arguments as Lightning 2.6's; docs/porting.md,
    "LightningCLI", says what differs)."""

    def __init__(
        self,
        model_class: Any = None,
        datamodule_class: Any = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: Any = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        parser_kwargs: dict[str, Any] | None = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: Any = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        """Parse the command line (or `args`), seed, build the model, DataModule and Trainer from the parsed
        config, and with `run` call the chosen subcommand's Trainer method."""
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.model_class, self.datamodule_class = model_class, datamodule_class
        self._model_class = model_class or Task  # the class the arguments come from (any subclass if None)
        self._datamodule_class = datamodule_class or DataModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data

        names = self.subcommands()
        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in names}
        sub_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in names}
        self.setup_parser(run, main_kwargs, sub_kwargs)
        self.parse_arguments(self.parser, args)
        self._parse_ckpt_path()
        self.subcommand = self.config["subcommand"] if run else None
        self._set_seed()
        self._instantiators: list[tuple[Any, type, bool]] = []
        if load_from_checkpoint_support:
            self._add_instantiators()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # ----- the parser ------------------------------------------------------------------------------
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """A parser with ``--config``; `kwargs` go to the parser class."""
        from jsonargparse import ActionConfigFile

        from trainer import __version__

        kwargs.setdefault("dump_header", [f"tandem-trainer=={__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c",
            "--config",
            action=ActionConfigFile,
            help="Path to a configuration file in json or yaml format.",
        )
        return parser

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], sub_kwargs: dict[str, Any]
    ) -> None:
        """The main parser, with a subparser per subcommand when `add_subcommands`."""
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments: dict[str, list[str]] = {}
            self._add_subcommands(self.parser, **sub_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``--seed_everything``."""
        parser.add_argument(
            "--seed_everything",
            type=bool | int,
            default=self.seed_everything_default,
            help="An int seeds every generator with it before the classes are built; true picks a seed.",
        )

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The Trainer's, the model's and the DataModule's arguments (``trainer``, ``model``, ``data``)."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        defaults = {
            f"trainer.{k}": tandem_paths(v) for k, v in self.trainer_defaults.items() if k != "callbacks"
        }
        parser.set_defaults(defaults)
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(
            self._datamodule_class,
            "data",
            subclass_mode=self.subclass_mode_data,
            required=self.datamodule_class is not None,  # without one, the task's own loaders serve
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments or links (``parser.link_arguments(...)``)."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:
                parser.add_optimizer_args((torch.optim.Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Each subcommand (a Trainer method) and the method's arguments the command line does not give."""
        return {
            "fit": {"model", "task", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "task", "dataloaders", "datamodule"},
            "test": {"model", "task", "dataloaders", "datamodule"},
            "predict": {"model", "task", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        from jsonargparse import class_from_function

        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        action = parser.add_subcommands()
        klass = (
            self.trainer_class
            if isinstance(self.trainer_class, type)
            else class_from_function(self.trainer_class)
        )
        for name in self.subcommands():
            description = _summary(getattr(klass, name))
            options = dict(kwargs.get(name, {}))
            options.setdefault("description", description)
            sub = self.init_parser(**options)
            self._add_arguments(sub)
            skip: set[str | int] = set(self.subcommands()[name])
            self._subcommand_method_arguments[name] = sub.add_method_arguments(klass, name, skip=skip)
            self._subcommand_parsers[name] = sub
            action.add_subcommand(name, sub, help=description)

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Pass optimizer and scheduler arguments with a `link_to` key on to that key (as a class_path dict)."""
        for key, (classes, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == AUTOMATIC:
                continue
            if isinstance(classes, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=partial(class_path_dict, classes))

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse `args` (a list as on a command line, a dict or a Namespace; None: sys.argv) into self.config."""
        if args is not None and len(sys.argv) > 1:
            warnings.warn(
                "LightningCLI's args parameter is meant to run it from Python as if from the command line; "
                f"it was given together with command-line arguments: sys.argv[1:]={sys.argv[1:]}, args={args}. "
                "Only `args` is used.",
                UserWarning,
                stacklevel=3,
            )
        if isinstance(args, dict):
            self.config = parser.parse_object(tandem_paths(args))
        elif type(args).__name__ == "Namespace":
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """As Lightning: a subcommand's ``--ckpt_path`` gives the model the hyperparameters it was trained with
        (read as data; every class they name must already be imported, trainer/cli/instantiate.py)."""
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if not path or not os.path.isfile(path):
            return
        from strategies.checkpoint.io import load

        hparams = dict(load(path, "cpu").get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            saved_classes_imported(module_type(self._model_class), hparams)
            self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    # ----- building --------------------------------------------------------------------------------
    def _add_instantiators(self) -> None:
        self._instantiators = [
            (CliInstantiator(self, "model"), module_type(self._model_class), self.subclass_mode_model),
            (CliInstantiator(self, "data"), module_type(self._datamodule_class), self.subclass_mode_data),
        ]

    def _dump_config(self) -> None:
        """The parsed config as plain data (what the model and DataModule record as hyperparameters)."""
        if hasattr(self, "config_dump"):
            return
        text = self.parser.dump(self.config, skip_link_targets=False, skip_unset=False, format="yaml")
        self.config_dump = yaml.safe_load(text)
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    def before_instantiate_classes(self) -> None:
        """Override to run code before the classes are built."""

    def instantiate_classes(self) -> None:
        """Build the classes of the parsed config (trust-checked first) and the Trainer."""
        self.config_init = self.parser.instantiate(self.config, instantiators=self._instantiators or None)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code after the classes are built."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """A Trainer from the parsed config; `kwargs` override its options (the config is not changed)."""
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        options = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(options, extra)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Trainer:
        if "callbacks" not in config:
            warnings.warn(
                f"The `{self.trainer_class.__qualname__}` class does not expose the `callbacks` argument so they "
                "will not be included.",
                UserWarning,
                stacklevel=3,
            )
            return self.trainer_class(**config)
        given = config["callbacks"]
        listed = [] if given is None else list(given) if isinstance(given, list) else [given]
        listed += callbacks
        default = self.trainer_defaults.get("callbacks")
        if default is not None:
            listed += [self._callback(c) for c in (default if isinstance(default, list) else [default])]
        if self.save_config_callback is not None and not config.get("fast_dev_run", False):
            listed.append(
                self.save_config_callback(
                    self._parser(self.subcommand),
                    self.config.get(str(self.subcommand), self.config),
                    **self.save_config_kwargs,
                )
            )
        return self.trainer_class(**{**config, "callbacks": listed})

    def _callback(self, value: Any) -> Any:
        """A trainer_defaults callback: an instance as given, or built from its ``{class_path, init_args}``
        (under the trust rules, as the config's callbacks are)."""
        if not (isinstance(value, dict) and "class_path" in value):
            return value
        from callbacks.base import Callback

        parser = LightningArgumentParser(exit_on_error=False)
        parser.add_subclass_arguments(Callback, "callback", fail_untyped=False)
        return parser.instantiate(parser.parse_object({"callback": tandem_paths(value)})).callback

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    @staticmethod
    def configure_optimizers(lightning_module: Any, optimizer: Any, lr_scheduler: Any = None) -> Any:
        """What the task's configure_optimizers returns when the config gives an optimizer (override to change
        it): the optimizer, ``[optimizer], [scheduler]``, or the dict form for ReduceLROnPlateau."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor},
            }
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """With an AUTOMATIC optimizer (and scheduler) in the config, the model's configure_optimizers builds
        them on its parameters and returns what `configure_optimizers` returns (trainer/cli/optimizers.py)."""
        if self.auto_configure_optimizers:
            attach_automatic(self, self._parser(subcommand))

    def _get(self, config: Any, key: str, default: Any = None) -> Any:
        """`key` of the config, inside the subcommand's part when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    # ----- running ---------------------------------------------------------------------------------
    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        fn = getattr(self, subcommand, getattr(self.trainer, subcommand))
        fn(**self._prepare_subcommand_kwargs(subcommand, fn))
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _prepare_subcommand_kwargs(self, subcommand: str, fn: Any = None) -> dict[str, Any]:
        """The method's arguments: the command line's, the model (as `task` where the method takes that
        name, Tandem's Trainer's, else as `model`) and the DataModule."""
        wanted = self._subcommand_method_arguments[subcommand]
        kwargs = {k: v for k, v in self.config_init[subcommand].items() if k in wanted}
        takes = _parameters(fn if fn is not None else getattr(self.trainer, subcommand))
        kwargs["task" if "task" in takes else "model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return kwargs

    def _set_seed(self) -> None:
        """seed_everything: an int as given, true a seed picked now (or the one already set: a launched worker
        takes its launcher's), false none; the config then holds the seed used."""
        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        if seed is True:
            held = os.environ.get("TANDEM_GLOBAL_SEED", "")
            seed = int(held) if held.isdigit() else random.SystemRandom().randrange(2**32)
        seed = seed_everything(seed, workers=True)
        part = self.config[self.subcommand] if self.subcommand else self.config
        part["seed_everything"] = seed


def _parameters(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _summary(fn: Any) -> str | None:
    """The first line of a method's docstring (a subcommand's help)."""
    doc = inspect.getdoc(fn)
    if not doc:
        return None
    import docstring_parser

    try:
        return docstring_parser.parse(doc).short_description
    except (ValueError, docstring_parser.ParseError):
        return doc.splitlines()[0]
