"""``StrategyRegistry``: Lightning's registry of strategy names (``lightning.pytorch.strategies.StrategyRegistry``),
a view of the table ``Trainer(strategy="name")`` and config files look names up in (strategies.STRATEGIES).

    StrategyRegistry.register("ddp_big_buckets", DDPStrategy, description="DDP, 100 MB buckets", bucket_cap_mb=100)
    Trainer(strategy="ddp_big_buckets")
    StrategyRegistry["ddp_spawn"]["init_params"]     # {'start_method': 'spawn'}

Each entry reads as Lightning's: ``{"strategy": class, "init_params": {...}, "description": str,
"strategy_name": name}``. Lightning's names Tandem refuses (DeepSpeed, XLA) are not entries: building them is
refused with what to use instead (strategies.REFUSED).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from tandem_core.errors import ConfigError

#: descriptions given to `register`, by name
_DESCRIPTIONS: dict[str, str] = {}


def _table() -> dict[str, tuple[Any, dict[str, Any]]]:
    from strategies.names import STRATEGIES

    return STRATEGIES


def strategy_class(target: Any) -> type:
    """The class a table entry names ("module:Class"), or the class registered itself."""
    if isinstance(target, type):
        return target
    module, _, name = str(target).partition(":")
    return getattr(importlib.import_module(module), name)


class _StrategyRegistry(Mapping[str, dict[str, Any]]):
    """The registered strategy names; `register`, `get`, `remove`, `available_strategies` as Lightning's."""

    def __getitem__(self, name: str) -> dict[str, Any]:
        target, params = _table()[name]
        cls = strategy_class(target)
        return {
            "strategy": cls,
            "init_params": dict(params),
            "description": _DESCRIPTIONS.get(name, f"{cls.__name__}({_args(params)})"),
            "strategy_name": name,
        }

    def __iter__(self) -> Iterator[str]:
        return iter(list(_table()))

    def __len__(self) -> int:
        return len(_table())

    def register(
        self,
        name: str,
        strategy: type | None = None,
        description: str | None = None,
        override: bool = False,
        **init_params: Any,
    ) -> Any:
        """Make `strategy` (a Strategy class) built with `init_params` available as `name`; without `strategy`, a
        decorator of the class. A name already registered needs ``override=True``."""
        from strategies.base import Strategy

        if not isinstance(name, str) or not name:
            raise ConfigError(f"StrategyRegistry.register: the name must be a non-empty string, got {name!r}")
        if name in _table() and not override:
            raise ConfigError(
                f"StrategyRegistry.register: {name!r} is registered already; pass override=True to replace it"
            )

        def do_register(cls: type) -> type:
            if not (isinstance(cls, type) and issubclass(cls, Strategy)):
                raise ConfigError(
                    f"StrategyRegistry.register({name!r}, ...): {cls!r} is not a Strategy class"
                )
            _table()[name] = (cls, dict(init_params))
            if description is not None:
                _DESCRIPTIONS[name] = description
            else:
                _DESCRIPTIONS.pop(name, None)
            return cls

        return do_register(strategy) if strategy is not None else do_register

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """A new strategy built from the entry `name`; `default` when there is none (if given), else a KeyError
        listing the names."""
        if name in _table():
            entry = self[name]
            return entry["strategy"](**entry["init_params"])
        if default is not None:
            return default
        raise KeyError(f"{name!r} is not a registered strategy; registered: {', '.join(self)}")

    def remove(self, name: str) -> None:
        """Forget the entry `name`."""
        _table().pop(name)
        _DESCRIPTIONS.pop(name, None)

    def available_strategies(self) -> list[str]:
        """Every registered name."""
        return list(self)

    def __str__(self) -> str:
        return "Registered Strategies: {}".format(", ".join(self))

    def __repr__(self) -> str:
        return f"StrategyRegistry({', '.join(self)})"


def _args(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


StrategyRegistry = _StrategyRegistry()
