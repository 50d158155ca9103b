"""Import aliases for running Lightning's own tests: ``lightning.pytorch`` / ``lightning.fabric`` resolved either to the
installed Lightning (``pytorch_lightning``, ``lightning_fabric``) or to Tandem's public names.

The Tandem side is a table of NAMES ONLY: each Lightning public name -> the Tandem object of the same meaning
("module:attribute"). Nothing here implements behaviour: a name Tandem lacks resolves to a stand-in that fails on
any use (absent.py), so the tests that use it fail and are classified while the rest of their file still runs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from absent import absent, flag_value  # noqa: E402
from classify import is_public  # noqa: E402

# Lightning package (below lightning.pytorch) -> {Lightning name: "tandem.module:attr" or "tandem.module" (same name)}
_TOP = {
    "__version__": "trainer",
    "Trainer": "trainer.trainer",
    "LightningModule": "trainer.task.base:Task",
    "LightningDataModule": "trainer.task.datamodule:DataModule",
    "Callback": "callbacks.base",
    "seed_everything": "trainer.seed",
}
_ERRORS = {"MisconfigurationException": "tandem_core.errors:TandemError"}
_UTILITIES = {  # the other helper's trainer.utilities holds the rest; looked up there by the same name
    "rank_zero_only": "tandem_core.rank_zero",
    **_ERRORS,
    **dict.fromkeys(
        (
            "lightning_hasattr",
            "lightning_getattr",
            "lightning_setattr",
            "clean_namespace",
            "parse_class_init_keys",
            "collect_init_args",
            "get_init_args",
        ),
        "trainer.utilities.parsing",
    ),  # fmt: skip
    "extract_batch_size": "trainer.utilities.data",
    "warning_cache": "trainer.utilities.data",
    "recursive_detach": "trainer.utilities.memory",
    "isolate_rng": "trainer.seed",
    "LightningDeprecationWarning": "tandem_core.rank_zero:TandemDeprecationWarning",
}
TANDEM: dict[str, dict[str, str]] = {
    "": _TOP,
    "core": {
        **_TOP,
        "load_hparams_from_yaml": "trainer.loggers.hparams_file",
        "save_hparams_to_yaml": "trainer.loggers.hparams_file",
        "load_hparams_from_tags_csv": "trainer.loggers.hparams_file",
        "save_hparams_to_tags_csv": "trainer.loggers.hparams_file",
        "LightningOptimizer": "trainer.loop.task_optimizer:TaskOptimizer",
        "HyperparametersMixin": "trainer.task.hparams",
        "datamodule.DataLoader": "trainer.task.datamodule",  # torch's, where from_datasets' loaders are built
    },
    "trainer": {
        **_TOP,
        "TrainerFn": "trainer.states",
        "TrainerStatus": "trainer.states",
        "RunningStage": "trainer.states",
        "TrainerState": "trainer.states",
    },
    "callbacks": {
        "*": "callbacks",
        "EarlyStoppingReason": "callbacks.early_stopping",
        "Tqdm": "callbacks.progress.tqdm_bar",
        "RichProgressBarTheme": "callbacks.progress.rich_bar",
        "CustomBarColumn": "callbacks.progress.rich_columns",
        "BatchesProcessedColumn": "callbacks.progress.rich_columns",
        "CustomTimeColumn": "callbacks.progress.rich_columns",
        "ProcessingSpeedColumn": "callbacks.progress.rich_columns",
        "MetricsTextColumn": "callbacks.progress.rich_columns",
        "Progress": "rich.progress",  # rich's own class, which Lightning's and Tandem's bars both draw with
        "get_available_flops": "callbacks.throughput.monitor",  # where Tandem's monitor looks it up (patched)
        # "<module>.<name>": a name of one Lightning module, where the Tandem code of the same job looks it up
        # (`mock.patch("lightning.pytorch.callbacks.timer.time")` patches the clock Tandem's Timer reads)
        "timer.time": "callbacks.timer",
        "model_checkpoint.time": "callbacks.checkpoint_schedule",
    },
    "loggers": {
        "*": "trainer.loggers",
        "Logger": "trainer.loggers.base",
        "DummyLogger": "trainer.loggers.dummy",
        "DummyExperiment": "trainer.loggers.dummy",
        "ExperimentWriter": "trainer.loggers.csv_logs",
    },
    "strategies": {"*": "strategies", "_DDP_FORK_ALIASES": "strategies:FORK_NAMES"},  # (a list of names)
    "accelerators": {"*": "strategies.accelerators"},
    "plugins": {
        "*": "trainer.plugins"
    },  # precision/, environments/, layer_sync: every name in trainer.plugins
    "profilers": {"*": "trainer.profilers"},
    "tuner": {
        "Tuner": "trainer.tuner",
        # patched by the tests (`patch("lightning.pytorch.tuner.batch_size_scaling.is_oom_error")`): where Tandem's
        # batch-size search looks it up
        "batch_size_scaling.is_oom_error": "trainer.tuner.batch_size",
    },
    "cli": {"*": "trainer.cli"},
    "demos": {"*": "trainer.demos"},
    "utilities": {
        "*": "trainer.utilities",
        **_UTILITIES,
        # utilities.model_summary (the utility, not the callback of the same name)
        **{
            name: "trainer.utilities.model_summary"
            for name in (
                "ModelSummary",
                "summarize",
                "get_human_readable_count",
                "get_formatted_model_size",
                "parse_batch_shape",
                "UNKNOWN_SIZE",
                "NOT_APPLICABLE",
                "LEFTOVER_PARAMS_NAME",
            )
        },
    },
}
# lightning.fabric under the Tandem run: only the user-facing names Lightning's tests import through it
TANDEM_FABRIC: dict[str, dict[str, str]] = {
    "": {"seed_everything": "trainer.seed"},
    # fabric's cluster environments are the very classes lightning.pytorch.plugins.environments exports
    "plugins": {
        name: "trainer.plugins"
        for name in (
            "ClusterEnvironment",
            "KubeflowEnvironment",
            "LightningEnvironment",
            "LSFEnvironment",
            "MPIEnvironment",
            "SLURMEnvironment",
            "TorchElasticEnvironment",
            "XLAEnvironment",
        )
    },
    "utilities": {
        "seed_everything": "trainer.seed",
        "rank_zero_only": "tandem_core.rank_zero",
        "PossibleUserWarning": "trainer.utilities.enums",
        "TrainingSpikeException": "callbacks.spike",
        "LightningDeprecationWarning": "tandem_core.rank_zero:TandemDeprecationWarning",
        # the `os` whose CPU count Tandem's suggested_max_num_workers reads (the standard library's, patched there)
        "data.os": "trainer.utilities.data",
        **_ERRORS,
    },
}


def _resolve(target: str, name: str) -> Any:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr or name)
    except (ImportError, AttributeError):
        raise AttributeError(name) from None


_MISSING = object()


class _NamesModule(types.ModuleType):
    """A module whose attributes are looked up in a name table; a name Tandem lacks is an absent.py stand-in."""

    def __init__(self, name: str, table: dict[str, str]) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package: its submodules resolve through the finder too
        local = ".".join(name.split(".")[3:])  # "timer" for lightning.pytorch.callbacks.timer
        # the package's names, with those given for this very module ("timer.time") under their own name
        self._table = {
            **{k: v for k, v in table.items() if "." not in k},
            **{k.rsplit(".", 1)[1]: v for k, v in table.items() if "." in k and k.rsplit(".", 1)[0] == local},
        }

    def __setattr__(self, name: str, value: Any) -> None:
        """`mock.patch("lightning.pytorch.x.Name", new)` patches the Tandem object Name is aliased to, where
        Tandem looks it up (only for a name listed by itself: "*" entries name a package, not where it is used)."""
        target = None if name.startswith("_") else self.__dict__.get("_table", {}).get(name)
        if target is not None:
            module, _, attr = target.partition(":")
            owner = importlib.import_module(module)
            saved = self.__dict__.setdefault("_patched", {})
            if name not in saved:
                saved[name] = (owner, attr or name, owner.__dict__.get(attr or name, _MISSING))
            setattr(owner, attr or name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        """The end of a patch: the Tandem module gets its own object back."""
        saved = self.__dict__.get("_patched", {}).pop(name, None)
        if saved is not None:
            owner, attr, original = saved
            if original is _MISSING:
                owner.__dict__.pop(attr, None)
            else:
                setattr(owner, attr, original)
        super().__delattr__(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name not in self._table:
            raise AttributeError(name)
        target = self._table.get(name) or self._table.get("*")
        if target is not None:
            try:
                return _resolve(target, name)
            except AttributeError:
                pass
        if _lightning_has(
            [*self.__name__.split("."), name]
        ):  # `from lightning.pytorch.loops import fetchers`
            return importlib.import_module(f"{self.__name__}.{name}")
        return _absent(self.__name__, name)


def _absent(module: str, name: str) -> Any:
    flag = flag_value(module, name)
    return flag if flag is not None else absent(f"{module}.{name}", is_public(module, name))


class _Loader(importlib.abc.Loader):
    def __init__(self, make: Any) -> None:
        self.make = make

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.make(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run, except on `importlib.reload(lightning.pytorch)` under the Tandem run: Lightning's
        package reads switches at import (POSSIBLE_USER_WARNINGS), so Tandem's package is imported again."""
        if (
            module.__name__ == "lightning.pytorch"
            and isinstance(module, _NamesModule)
            and "trainer" in sys.modules
        ):
            importlib.reload(sys.modules["trainer"])


class AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``lightning``, ``lightning.pytorch[.x]``, ``lightning.fabric[.x]`` for one of the two runs."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        parts = fullname.split(".")
        if parts[0] != "lightning":
            return None
        if len(parts) == 1:
            return importlib.machinery.ModuleSpec(fullname, _Loader(_package), is_package=True)
        if parts[1] not in ("pytorch", "fabric"):
            return None
        if self.mode == "lightning":  # the very modules of the installed Lightning, under a second name
            real = {"pytorch": "pytorch_lightning", "fabric": "lightning_fabric"}[parts[1]]
            real_name = ".".join([real, *parts[2:]])
            try:
                importlib.import_module(real_name)
            except ImportError:
                return None
            return importlib.machinery.ModuleSpec(fullname, _Loader(lambda _n: sys.modules[real_name]))
        if not _lightning_has(parts):
            return None  # not a module of Lightning (e.g. a missing name tried as a submodule by `from x import y`)
        tables = TANDEM if parts[1] == "pytorch" else TANDEM_FABRIC
        sub = parts[2] if len(parts) > 2 else ""
        table = tables.get(sub, {})  # a module with no Tandem counterpart: every name in it is a stand-in
        return importlib.machinery.ModuleSpec(
            fullname, _Loader(lambda n: _NamesModule(n, table)), is_package=True
        )


def _lightning_has(parts: list[str]) -> bool:
    """Whether the installed Lightning has the module lightning.<pytorch|fabric>.<rest> (looked up on disk)."""
    spec = importlib.util.find_spec({"pytorch": "pytorch_lightning", "fabric": "lightning_fabric"}[parts[1]])
    if spec is None or not spec.submodule_search_locations:
        return False
    path = os.path.join(spec.submodule_search_locations[0], *parts[2:])
    return len(parts) == 2 or os.path.isdir(path) or os.path.isfile(path + ".py")


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []
    return module


_LIGHTNING_NAMES: dict[int, str] = {}


def lightning_name(obj: Any) -> str | None:
    """The Lightning name a Tandem object stands for where the two names differ (Task -> "LightningModule"),
    so that a test parametrized by classes gets Lightning's test id under the Tandem run too."""
    if not _LIGHTNING_NAMES:
        for tables in (TANDEM, TANDEM_FABRIC):
            for table in tables.values():
                for name, target in table.items():
                    if name == "*" or name.startswith("_"):
                        continue
                    try:
                        found = _resolve(target, name)
                    except AttributeError:
                        continue
                    if getattr(found, "__name__", name) != name:
                        _LIGHTNING_NAMES.setdefault(id(found), name)
    return _LIGHTNING_NAMES.get(id(obj))


def install(mode: str) -> None:
    """Put the finder first on sys.meta_path (mode: "lightning" or "tandem")."""
    if mode not in ("lightning", "tandem"):
        raise ValueError(f"mode must be 'lightning' or 'tandem', not {mode!r}")
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):  # once per process
        sys.meta_path.insert(0, AliasFinder(mode))
