"""Run configs: YAML files + ``key=value`` overrides -> one validated, resolved dict -> Trainer, Task, data.

Example::

    run = build("examples/configs/digits.yaml", ["trainer.max_epochs=3", "task.lr=0.05"])
    run.trainer.fit(run.task, datamodule=run.datamodule)

Sections (docs/configuration.md): ``seed_everything``, ``trainer`` (the options of trainer/options.py),
``task`` and ``data`` (``_target_`` import path + arguments), ``callbacks`` and ``logger`` (lists of
``_target_`` entries). Interpolation (``${trainer.default_root_dir}``, ``${oc.env:VAR,default}``) is
omegaconf's. Every mistake is a ConfigError that names the key and says what to change.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import pkgutil
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from trainer.errors import ConfigError, TandemError, choose, did_you_mean
from trainer.options import TrainerConfig

if TYPE_CHECKING:
    from trainer.datamodule import DataModule
    from trainer.task import Task
    from trainer.trainer import Trainer

SECTIONS = ("seed_everything", "trainer", "task", "data", "callbacks", "logger")
TARGET, PARTIAL = "_target_", "_partial_"
# A strategy given as a _target_ entry takes these from the trainer section (one place to set them).
FROM_TRAINER = ("accelerator", "devices", "num_nodes")
Source = str | os.PathLike | Mapping[str, Any] | DictConfig


# ----- loading and merging -------------------------------------------------------------------------
def load(sources: Source | Sequence[Source] | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """Merge config files (or dicts) in order, then apply ``key=value`` overrides: the last one wins."""
    if sources is None:
        sources = []
    elif isinstance(sources, (str, os.PathLike, Mapping, DictConfig)):
        sources = [sources]
    cfg = OmegaConf.create()
    for src in sources:
        try:
            cfg = OmegaConf.merge(cfg, _read(src))
        except TandemError:
            raise
        except Exception as e:
            raise ConfigError(f"cannot merge config {src!r}: {_brief(e)}") from e
    for item in overrides:
        if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"override {item!r} is not key=value (for example trainer.max_epochs=3)")
        try:
            cfg.merge_with_dotlist([item])
        except Exception as e:  # omegaconf's grammar and YAML's parser both reject text here
            raise ConfigError(f"cannot apply override {item!r}: {_brief(e)}") from e
    return cfg


def _read(src: Source) -> DictConfig:
    if isinstance(src, DictConfig):
        return src
    if isinstance(src, Mapping):
        try:
            return OmegaConf.create(dict(src))
        except Exception as e:
            raise ConfigError(
                f"a config holds only YAML values (mappings, lists, numbers, strings): {_brief(e)}"
            ) from e
    path = os.fspath(src)
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {_brief(e)}") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"config file {path!r} must hold a mapping of sections ({', '.join(SECTIONS)})")
    return cfg


def _brief(e: BaseException) -> str:
    """An omegaconf/YAML message on one line, with the key it concerns."""
    skip = ("full_key:", "object_type", "reference_type", 'in "<unicode string>"')
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith(skip)]
    text = "; ".join(lines)[:300] or type(e).__name__
    key = getattr(e, "full_key", None)
    return f"{text} (at {key})" if key else text


# ----- resolving and validating --------------------------------------------------------------------
def resolve(source: Source | Sequence[Source] | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load, interpolate and validate: a plain dict with every section and every Trainer option."""
    cfg = source if isinstance(source, DictConfig) and not overrides else load(source, overrides)
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(
            f"{e.full_key} is required (it is ??? in the config): set it, e.g. {e.full_key}=..."
        ) from e
    except Exception as e:
        raise ConfigError(f"cannot resolve the config: {_brief(e)}") from e
    return validate(data)


def validate(data: Any) -> dict[str, Any]:
    """Check a plain config dict; return it with all sections, Trainer defaults and target defaults filled."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"a config is a mapping of sections ({', '.join(SECTIONS)}), got {type(data).__name__}"
        )
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(
                f"unknown section {key!r}{did_you_mean(str(key), SECTIONS)} (sections: {', '.join(SECTIONS)})"
            )
    seed = data.get("seed_everything", True)
    if not (seed is None or isinstance(seed, bool) or (isinstance(seed, int) and 0 <= seed < 2**32)):
        raise ConfigError(
            f"seed_everything must be an int in [0, 2**32), true (pick one) or false, got {seed!r}"
        )
    out: dict[str, Any] = {"seed_everything": seed, "trainer": _check_trainer(data.get("trainer"))}
    for name in ("task", "data"):
        out[name] = None if data.get(name) is None else _check_target(data[name], name)
    for name in ("callbacks", "logger"):
        out[name] = _check_list(data.get(name), name)
    if out["logger"] and out["trainer"]["logger"] is False:
        raise ConfigError(
            "trainer.logger is false but the logger section lists loggers; remove one or the other"
        )
    return out


def _check_trainer(section: Any) -> dict[str, Any]:
    section = {} if section is None else section
    if not isinstance(section, dict):
        raise ConfigError(f"trainer: expected a mapping of Trainer options, got {section!r}")
    names = TrainerConfig.names()
    for key in section:
        if key not in names:
            raise ConfigError(
                f"unknown key 'trainer.{key}'{did_you_mean(str(key), names)} "
                "(every Trainer option is listed in docs/configuration.md)"
            )
    options = {name: section.get(name, default) for name, default in trainer_defaults().items()}
    if options["callbacks"] is not None:
        raise ConfigError("trainer.callbacks: list callbacks in the top-level 'callbacks:' section instead")
    if not isinstance(options["logger"], bool):
        raise ConfigError(
            f"trainer.logger must be true or false, got {options['logger']!r}; "
            "list logger entries in the top-level 'logger:' section"
        )
    options["strategy"] = _check_strategy(options["strategy"])
    _check_precision(options["precision"])
    for key in section:  # one option at a time, so that the message names the option that is wrong
        if key in ("strategy", "callbacks", "logger"):
            continue
        try:
            TrainerConfig(**{key: options[key]})
        except ConfigError as e:
            msg = str(e)
            msg = msg[len(key) + 1 :] if msg.startswith(f"{key} ") else msg
            raise ConfigError(f"trainer.{key}: {msg}") from None
    try:
        TrainerConfig(**{k: v for k, v in options.items() if k != "strategy"})  # checks across options
    except ConfigError as e:
        raise ConfigError(f"trainer: {e}") from None
    return options


def trainer_defaults() -> dict[str, Any]:
    """Every Trainer option with its default, in TrainerConfig's order."""
    return {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(TrainerConfig)}  # type: ignore[misc]


def _check_strategy(strategy: Any) -> Any:
    if isinstance(strategy, dict):
        return _check_target(strategy, "trainer.strategy", skip_defaults=(*FROM_TRAINER, "precision"))
    from strategies import STRATEGIES

    names = ["auto", *STRATEGIES]
    if not isinstance(strategy, str):
        raise ConfigError(
            f"trainer.strategy must be a name ({', '.join(names)}) or a _target_ entry, got {strategy!r}"
        )
    try:
        choose("strategy", strategy, names)
    except ConfigError as e:
        raise ConfigError(f"trainer.strategy: {e}") from None
    return strategy


def _check_precision(precision: Any) -> None:
    from strategies.precision import PRECISIONS

    ok = (
        isinstance(precision, (int, str)) and not isinstance(precision, bool) and str(precision) in PRECISIONS
    )
    if not ok:
        valid = ", ".join(repr(p) for p in PRECISIONS)
        raise ConfigError(
            f"trainer.precision: unknown precision {precision!r}{did_you_mean(str(precision), PRECISIONS)}"
            f" (valid: {valid})"
        )


def _check_list(value: Any, name: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, dict) and TARGET in value:
        value = [value]  # a single entry
    if not isinstance(value, list):
        hint = "; to turn logging off set trainer.logger: false" if name == "logger" else ""
        raise ConfigError(f"{name}: expected a list of _target_ entries, got {value!r}{hint}")
    return [_check_target(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _check_target(node: Any, where: str, skip_defaults: Sequence[str] = ()) -> dict[str, Any]:
    """Check that a ``_target_`` entry imports and that its arguments match the signature; fill defaults."""
    if not isinstance(node, dict) or TARGET not in node:
        raise ConfigError(
            f"{where}: expected a mapping with _target_ (an import path such as examples.digits.DigitsTask) "
            f"and the arguments, got {node!r}"
        )
    target, partial = node[TARGET], node.get(PARTIAL, False)
    obj = locate(target, f"{where}._target_")
    if not isinstance(partial, bool):
        raise ConfigError(f"{where}._partial_ must be true or false, got {partial!r}")
    args: dict[str, Any] = {}
    for key, value in node.items():
        if key in (TARGET, PARTIAL):
            continue
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"{where}: argument names are identifiers, got {key!r}")
        args[key] = _check_value(value, f"{where}.{key}")
    params = _params(obj)
    out: dict[str, Any] = {TARGET: target, **({PARTIAL: True} if partial else {})}
    if params is None:  # no signature to check against (some builtins)
        return {**out, **args}
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        for key in args:
            if key not in named:
                raise ConfigError(
                    f"unknown key '{where}.{key}': {target} has no argument {key!r}{did_you_mean(key, named)} "
                    f"(its arguments: {', '.join(named) or 'none'})"
                )
    required = [p.name for p in params if p.name in named and p.default is p.empty and p.name not in args]
    if required and not partial:
        raise ConfigError(
            f"{where}: {target} needs {', '.join(repr(n) for n in required)}; set them under {where}"
        )
    for p in params:  # the signature's order, with its defaults: the saved config does not depend on them
        if p.name in args:
            out[p.name] = args.pop(p.name)
        elif p.name in named and p.name not in skip_defaults and _plain(p.default):
            out[p.name] = p.default
    return {**out, **args}


def _check_value(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        if TARGET in value:
            return _check_target(value, where)
        return {k: _check_value(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_check_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _plain(value: Any) -> bool:
    return value is None or type(value) in (bool, int, float, str)


def _params(obj: Any) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None


def locate(path: Any, where: str = "_target_") -> Any:
    """Import ``pkg.module.Name`` (or ``pkg.module:Name``); a ConfigError names the path and what failed."""
    if not isinstance(path, str) or not all(p.isidentifier() for p in path.replace(":", ".").split(".")):
        raise ConfigError(f"{where}: {path!r} is not an import path such as examples.digits.DigitsTask")
    if ":" in path:
        module_name, _, rest = path.partition(":")
        parts, cut = [*module_name.split("."), *rest.split(".")], len(module_name.split("."))
        candidates = [cut]
    else:
        parts = path.split(".")
        candidates = list(range(len(parts), 0, -1))  # the longest prefix that is a module
    module, cut, name = None, 0, path
    for cut in candidates:
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                continue  # this prefix is no module: try a shorter one
            raise ConfigError(f"{where}: importing {name!r} for {path!r} failed: {e}") from e
        except Exception as e:
            raise ConfigError(
                f"{where}: importing {name!r} for {path!r} failed: {type(e).__name__}: {e}"
            ) from e
    if module is None:
        raise ConfigError(
            f"{where}: cannot import {path!r}: there is no module {name!r}. Check the spelling, and that the "
            "package is installed or in the current directory."
        )
    obj, owner = module, ".".join(parts[:cut])
    for attr in parts[cut:]:
        if not hasattr(obj, attr):
            choices = [n for n in dir(obj) if not n.startswith("_")]
            if hasattr(obj, "__path__"):  # a package: its submodules too
                choices += [m.name for m in pkgutil.iter_modules(obj.__path__)]
            raise ConfigError(
                f"{where}: cannot import {path!r}: {owner!r} has no {attr!r}{did_you_mean(attr, choices)}"
            )
        obj, owner = getattr(obj, attr), f"{owner}.{attr}"
    if not callable(obj):
        raise ConfigError(f"{where}: {path!r} is a {type(obj).__name__}, not a class or function")
    return obj


# ----- building ------------------------------------------------------------------------------------
def instantiate(node: Any, where: str = "config", **inject: Any) -> Any:
    """Build ``_target_`` entries (depth first); other mappings and lists are rebuilt, values kept.

    `inject` fills arguments the entry does not set and its target accepts.
    """
    if isinstance(node, list):
        return [instantiate(v, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if TARGET not in node:
        return {k: instantiate(v, f"{where}.{k}") for k, v in node.items()}
    target = node[TARGET]
    obj = locate(target, f"{where}._target_")
    kwargs = {k: instantiate(v, f"{where}.{k}") for k, v in node.items() if k not in (TARGET, PARTIAL)}
    names = {p.name for p in _params(obj) or []}
    kwargs = {**{k: v for k, v in inject.items() if k in names}, **kwargs}
    if node.get(PARTIAL):
        return functools.partial(obj, **kwargs)
    try:
        return obj(**kwargs)
    except TandemError as e:
        raise ConfigError(f"{where} ({target}): {e}") from e
    except Exception as e:
        raise ConfigError(f"{where}: building {target} failed: {type(e).__name__}: {e}") from e


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
    """Resolve the config, seed, build the callbacks, the loggers and the Trainer, then the task and data."""
    from callbacks.base import Callback
    from trainer.loggers import Logger
    from trainer.trainer import Trainer

    cfg = resolve(source, overrides)
    cfg["seed_everything"] = _pick_seed(cfg["seed_everything"])  # pinned: the saved config repeats it
    _seed(cfg)
    callbacks = [
        _built(instantiate(c, f"callbacks[{i}]"), Callback, f"callbacks[{i}]", "callbacks.Callback")
        for i, c in enumerate(cfg["callbacks"])
    ]
    loggers = [
        _built(instantiate(c, f"logger[{i}]"), Logger, f"logger[{i}]", "trainer.loggers.Logger")
        for i, c in enumerate(cfg["logger"])
    ]
    kwargs = dict(cfg["trainer"], callbacks=callbacks or None)
    if loggers:
        kwargs["logger"] = loggers
    if isinstance(kwargs["strategy"], dict):
        kwargs["strategy"] = _build_strategy(kwargs["strategy"], kwargs)
    try:
        trainer = (trainer_cls or Trainer)(**kwargs)
    except TandemError:
        raise
    except Exception as e:  # an option that only a callback's constructor checks (e.g. Timer for max_time)
        raise ConfigError(f"trainer: building the Trainer failed: {type(e).__name__}: {e}") from e
    trainer.resolved_config = cfg
    run = Run(trainer, None, None, cfg)
    return build_task(run) if with_task else run


def build_task(run: Run) -> Run:
    """Build the task and data of `run.config` into `run`, seeded afresh so that the task's initial
    weights depend on the seed only. The command calls it inside ``strategy.launch``: a process that only
    launches workers never builds them."""
    from trainer.datamodule import DataModule
    from trainer.task import Task

    cfg = run.config
    if cfg["task"] is None:
        raise ConfigError("the config has no task section; add task: {_target_: your.module.YourTask, ...}")
    _seed(cfg)
    run.task = _built(instantiate(cfg["task"], "task"), Task, "task", "trainer.Task")
    if cfg["data"] is not None:
        run.datamodule = _built(instantiate(cfg["data"], "data"), DataModule, "data", "trainer.DataModule")
    return run


def _seed(cfg: dict[str, Any]) -> None:
    if cfg["seed_everything"] is not None:
        from trainer.seed import seed_everything

        seed_everything(cfg["seed_everything"], workers=True)


def trainer_from_config(
    source: Source | Sequence[Source], overrides: Sequence[str] = (), cls: type[Trainer] | None = None
) -> Trainer:
    """Trainer.from_config: the Trainer of a config (its trainer, callbacks, logger and seed sections)."""
    return build(source, overrides, with_task=False, trainer_cls=cls).trainer


def _built(obj: Any, kind: type, where: str, kind_name: str) -> Any:
    if not isinstance(obj, kind):
        raise ConfigError(f"{where}: built a {type(obj).__name__}, which is not a {kind_name}")
    return obj


def _build_strategy(node: dict[str, Any], options: dict[str, Any]) -> Any:
    """A strategy _target_ entry, given accelerator, devices and num_nodes from the trainer section."""
    from strategies.base import Strategy

    defaults = trainer_defaults()
    for name in FROM_TRAINER:
        value = options[name]
        if name in node and value != defaults[name] and node[name] != value:
            raise ConfigError(
                f"trainer.strategy.{name}={node[name]!r} disagrees with trainer.{name}={value!r}; "
                f"set {name} in the trainer section only"
            )
    accepts = {p.name for p in _params(locate(node[TARGET])) or []}
    if "devices" in accepts and "devices" not in node and options["devices"] == "auto":
        raise ConfigError(
            f"trainer.strategy: {node[TARGET]} takes its devices from trainer.devices, which is 'auto'; "
            "set trainer.devices to a number"
        )
    inject = {name: options[name] for name in FROM_TRAINER}  # the entry's own values win (instantiate)
    return _built(instantiate(node, "trainer.strategy", **inject), Strategy, "trainer.strategy", "Strategy")


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


# ----- writing -------------------------------------------------------------------------------------
def to_yaml(config: Mapping[str, Any]) -> str:
    """The config as YAML that `load` reads back to the same values (``${`` in strings is escaped)."""
    return OmegaConf.to_yaml(OmegaConf.create(_escape(dict(config))))


def _escape(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v) for v in value]
    return value


def save(config: Mapping[str, Any], path: str | os.PathLike[str]) -> str:
    """Write `config` as YAML to `path` (atomically); return the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(to_yaml(config))
    os.replace(tmp, path)
    return path


def write_run_config(trainer: Trainer) -> str | None:
    """Save a config-built trainer's resolved config as <log_dir>/config.yaml (global rank 0 only)."""
    if trainer.resolved_config is None or not trainer.is_global_zero or trainer.config.fast_dev_run:
        return None  # fast_dev_run writes no logs and no checkpoints: no config either
    return save(trainer.resolved_config, os.path.join(trainer.log_dir, "config.yaml"))
