"""Environment values a config reads (``${oc.env:API_KEY}``, in any spelling) are kept out of what a run writes.

The run itself gets the values; everything written (config.yaml, ``--print-config``, each checkpoint's
"config" and hyperparameters, the loggers' and trackers' hyperparameters, the `tandem` command's error
messages) holds the interpolation text instead: every occurrence of such a value in a string, also inside a
longer string or where another key interpolates it, becomes ``${oc.env:NAME}`` (with the config's default,
``${oc.env:NAME,default}``, when it has a plain one). Reading config.yaml back interpolates it again.
Which values are secrets is decided by the resolver, not by the text: `env_values` resolves the config with
the resolvers watched and records what ``oc.env`` returned (and any resolver's string equal to an
environment value), so ``${oc.env:'KEY'}``, ``${oc.env:"KEY",'d'}`` and ``${oc.env:${task.key_name}}`` are
all found. Values shorter than MIN_LENGTH characters (a flag, a count) are not treated as secrets, nor
values that are not strings once resolved (``${oc.decode:${oc.env:N}}``). Example::

    secrets = env_values(load("run.yaml"))        # {"s3cr3t-value": "${oc.env:API_KEY}"}
    redact({"key": "s3cr3t-value"}, secrets)      # {"key": "${oc.env:API_KEY}"}

A leaf module: the Trainer layer redacts without importing the config layer (or omegaconf).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

MIN_LENGTH = 4
_ENV = re.compile(r"\$\{\s*oc\.env\s*:\s*([A-Za-z_][A-Za-z0-9_]*)")


def env_values(cfg: DictConfig) -> dict[str, str]:
    """value -> its interpolation text, for each environment value that resolving `cfg` reads.

    Redaction follows the resolver, not the spelling: `cfg` is resolved once with every registered resolver
    watched. What ``oc.env`` returns from the environment is recorded under the variable it read, whatever
    the text looked like (``${oc.env:'KEY'}``, ``${oc.env:"KEY",'d'}``, ``${oc.env:${task.key_name}}``);
    a string any other resolver returns that equals a set environment value (a resolver of the user's that
    reads the environment) is recorded under that variable. Unset variables resolve to the config's own
    default, which is no secret. Every value found is also added to `recorded()` (error messages)."""
    from omegaconf import OmegaConf  # only the config layer calls this: the Trainer never imports omegaconf
    from omegaconf.basecontainer import BaseContainer

    found: dict[str, str] = {}
    by_value = {v: k for k, v in sorted(os.environ.items()) if len(v) >= MIN_LENGTH}

    def note(name: str, value: Any, default: Any = None) -> None:
        if isinstance(value, str) and len(value) >= MIN_LENGTH and os.environ.get(name) == value:
            plain = isinstance(default, str) and _PLAIN.fullmatch(default) and default not in by_value
            text = "${oc.env:" + name + (f",{default}" if plain else "") + "}"
            found.setdefault(value, text if _NAME.fullmatch(name) else "<redacted environment value>")

    def watch(name: str, wrapped: Callable[..., Any]) -> Callable[..., Any]:
        def watched(config: Any, parent: Any, node: Any, args: tuple[Any, ...], args_str: Any) -> Any:
            value = wrapped(config, parent, node, args, args_str)
            if name == "oc.env" and args and isinstance(args[0], str):
                note(args[0], value, args[1] if len(args) > 1 else None)
            elif not name.startswith("oc.") and isinstance(value, str) and value in by_value:
                note(by_value[value], value)  # a resolver of the user's (omegaconf's own read no environment)
            return value

        return watched

    saved = dict(BaseContainer._resolvers)
    try:
        for name, wrapped in saved.items():
            BaseContainer._resolvers[name] = watch(name, wrapped)
        OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        pass  # resolve() reports what is wrong; the values read before it failed are recorded
    finally:
        BaseContainer._resolvers.clear()
        BaseContainer._resolvers.update(saved)
    _RECORDED.update(found)
    return dict(sorted(found.items()))


_PLAIN = re.compile(r"[\w./:@+-]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RECORDED: dict[str, str] = {}  # every environment value any config of this process resolved


def recorded() -> dict[str, str]:
    """Every secret `env_values` found in this process (to redact error messages with)."""
    return dict(_RECORDED)


def split(text: str, secrets: dict[str, str]) -> list[tuple[str, bool]]:
    """`text` in pieces: (plain text, False) and (interpolation text of a secret, True)."""
    if not secrets:
        return [(text, False)]
    pattern = "|".join(re.escape(v) for v in sorted(secrets, key=len, reverse=True))
    pieces = re.split(f"({pattern})", text)
    return [(secrets[p], True) if i % 2 else (p, False) for i, p in enumerate(pieces) if p or i % 2]


def redact(value: Any, secrets: dict[str, str]) -> Any:
    """`value` (plain data: dicts, lists, tuples, strings, ...) with every secret's value replaced by its
    interpolation text; anything else is returned as it is."""
    if not secrets:
        return value
    if isinstance(value, str):
        return "".join(p for p, _ in split(value, secrets))
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    if type(value) is tuple:
        return tuple(redact(v, secrets) for v in value)
    return value


def unresolved(hparams: dict[str, Any]) -> list[str]:
    """The keys of `hparams` whose (string) value still holds an ``${oc.env:...}`` text (a redacted secret)."""
    return sorted(str(k) for k, v in hparams.items() if isinstance(v, str) and _ENV.search(v))


@contextlib.contextmanager
def redacted_errors() -> Iterator[None]:
    """An exception raised inside says no recorded secret in clear: its message is redacted in place."""
    try:
        yield
    except Exception as e:
        secrets = recorded()
        if secrets and e.args and any(isinstance(a, str) and redact(a, secrets) != a for a in e.args):
            e.args = tuple(redact(a, secrets) if isinstance(a, str) else a for a in e.args)
        raise
