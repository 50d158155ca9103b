"""``Trainer(plugins=[...])``: Lightning's plugin kinds, each handed to the strategy by Lightning's rules.

One plugin of each kind at most (KINDS: precision, checkpoint IO, cluster environment, layer sync); anything
else is refused naming the kinds. A precision plugin is the run's precision (with ``precision=`` as well it is
refused: choose one), a cluster environment says where the processes come from and their ranks
(strategies/environments/), a checkpoint IO writes and reads the checkpoints, a layer-sync plugin synchronizes
layers (``sync_batchnorm=True`` is ``TorchSyncBatchNorm()``). A plugin of a kind the strategy instance already
has one of (``DDPStrategy(precision=...)`` and ``plugins=[MixedPrecision(...)]``) is refused too.
"""

from __future__ import annotations

import collections
import functools
import importlib
import operator
from dataclasses import dataclass
from typing import Any

from tandem_core.errors import ConfigError


@dataclass(frozen=True)
class Kind:
    """A kind of plugin: Lightning's name for it, its base class ("module:Class"), and where a strategy keeps
    one (the attribute `attr`)."""

    name: str
    base: str
    attr: str

    def cls(self) -> type:
        module, _, name = self.base.partition(":")
        return getattr(importlib.import_module(module), name)


#: the plugin kinds, in Lightning's order of its error messages. The checkpoint IO kind is the other side's
#: hook: its base class is whatever strategies/checkpoint/ offers as Lightning's CheckpointIO.
KINDS = (
    Kind("Precision", "strategies.precision:Precision", "precision"),
    Kind("CheckpointIO", "strategies.checkpoint.io:CheckpointIO", "checkpoint_io"),
    Kind("ClusterEnvironment", "strategies.environments.base:ClusterEnvironment", "cluster_environment"),
    Kind("LayerSync", "strategies.layer_sync:LayerSync", "layer_sync"),
)


def plugin_type() -> Any:
    """The type a plugin is (a Union of the kinds' base classes): what a config's ``trainer.plugins`` may build."""
    return functools.reduce(operator.or_, [k.cls() for k in KINDS])


def kind_of(plugin: Any) -> Kind | None:
    """The kind `plugin` is an instance of, or None."""
    return next((k for k in KINDS if isinstance(plugin, k.cls())), None)


def sort_plugins(plugins: Any) -> dict[str, Any]:
    """{kind name: plugin} for the Trainer's `plugins` (None, one plugin, or a list); a ConfigError for an
    object of no kind, or two of one kind."""
    items = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    found: dict[str, Any] = {}
    counts: collections.Counter[str] = collections.Counter()
    for item in items:
        kind = kind_of(item)
        if kind is None:
            what = repr(item) if isinstance(item, str) else type(item).__name__
            names = ", ".join(k.name for k in KINDS)
            raise ConfigError(
                f"plugins must be plugins of Lightning's kinds ({names}); {what} is of none of them: set "
                "precision=..., strategy=... or sync_batchnorm=... for the rest"
            )
        counts[kind.name] += 1
        found[kind.name] = item
    twice = [name for name, n in counts.items() if n > 1]
    if twice:
        raise ConfigError(
            f"plugins must hold at most one plugin of each kind; received multiple values for {', '.join(twice)}"
        )
    return found


def apply_plugins(
    strategy: Any, plugins: Any, options: dict[str, Any], given: set[str] | frozenset[str]
) -> None:
    """Hand the Trainer's plugins to `strategy` (before the Trainer's other options fill it), by Lightning's
    rules; the layer sync that ``sync_batchnorm=True`` asks for too."""
    from strategies.layer_sync import TorchSyncBatchNorm

    found = sort_plugins(plugins)
    sync = bool(options.get("sync_batchnorm", False))
    precision = found.get("Precision")
    if precision is not None:
        if "precision" in given and options.get("precision") is not None:
            raise ConfigError(
                f"received both precision={options['precision']!r} and plugins=[{type(precision).__name__}(...)]; "
                "choose one (the plugin is the precision)"
            )
        from strategies.precision_plugins import check_overrides

        check_overrides(precision)
    layer_sync = found.get("LayerSync")
    if layer_sync is not None and sync and not isinstance(layer_sync, TorchSyncBatchNorm):
        raise ConfigError(
            f"Trainer(sync_batchnorm=True) and plugins=[{type(layer_sync).__name__}()] both say how to synchronize "
            "layers; choose one"
        )
    if layer_sync is None and sync:
        layer_sync = found["LayerSync"] = TorchSyncBatchNorm()
    for kind in KINDS:
        plugin = found.get(kind.name)
        if plugin is None:
            continue
        _hand_over(strategy, kind, plugin)


def _hand_over(strategy: Any, kind: Kind, plugin: Any) -> None:
    """`strategy` takes `plugin` for `kind` unless its constructor was given one already."""
    name = type(strategy).__name__
    if kind.name == "Precision":
        own = strategy._precision
        if own is not None and own is not plugin:
            raise ConfigError(
                f"the precision is set both by {name}(precision=...) and by plugins=[{type(plugin).__name__}]; "
                "choose one"
            )
        strategy._precision = plugin
        return
    if kind.name == "CheckpointIO":
        if getattr(strategy, "_checkpoint_io_given", False) and strategy.checkpoint_io is not plugin:
            raise ConfigError(
                f"checkpoint_io is set both by {name}(checkpoint_io=...) and in plugins; choose one"
            )
        strategy.checkpoint_io = (
            plugin  # joins the strategy's own form, or is refused (checkpoint/plugins.py)
        )
        return
    if kind.name == "ClusterEnvironment":
        if not hasattr(strategy, "cluster_environment"):  # one process: nothing to take from the cluster
            return
        own = strategy.cluster_environment
        if own is not None and own is not plugin:
            raise ConfigError(
                f"the cluster environment is set both by {name}(cluster_environment=...) and in plugins; choose one"
            )
        strategy.cluster_environment = plugin
        return
    # LayerSync: only strategies of several processes have layers to synchronize
    if hasattr(strategy, "layer_sync"):
        strategy.layer_sync = plugin
