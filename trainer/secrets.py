"""Environment values a config interpolates (``${oc.env:API_KEY}``) are kept out of the files a run writes.

The run itself gets the values; everything written (config.yaml, ``--print-config``, each checkpoint's
"config" and hyperparameters, the loggers' hyperparameters) holds the interpolation text instead: every
occurrence of such a value in a string, also inside a longer string or where another key interpolates
it, becomes ``${oc.env:NAME}`` (with the config's default, ``${oc.env:NAME,default}``, when it has a plain
one). Reading config.yaml back interpolates it again from the environment.
Values shorter than MIN_LENGTH characters (a flag, a count) are not treated as secrets, nor values that
are not strings once resolved (``${oc.decode:${oc.env:N}}``). Example::

    secrets = env_values(load("run.yaml"))        # {"s3cr3t-value": "${oc.env:API_KEY}"}
    redact({"key": "s3cr3t-value"}, secrets)      # {"key": "${oc.env:API_KEY}"}

A leaf module: the Trainer layer redacts without importing the config layer (or omegaconf).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

MIN_LENGTH = 4
_ENV = re.compile(r"\$\{\s*oc\.env\s*:\s*([A-Za-z_][A-Za-z0-9_]*)")
_WHOLE = re.compile(r"\$\{\s*oc\.env\s*:\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:,[^{}$]*)?\}")  # a plain default


def env_values(cfg: DictConfig) -> dict[str, str]:
    """value -> its interpolation text, for each environment variable that `cfg` interpolates and that is
    set now (the unset ones resolve to the config's own default, which is no secret)."""
    from omegaconf import OmegaConf  # only the config layer calls this: the Trainer never imports omegaconf

    texts: dict[str, str] = {}  # name -> its first interpolation text, with its default when it has one

    def visit(text: str) -> None:
        for m in _ENV.finditer(text):
            whole = _WHOLE.match(text, m.start())
            texts.setdefault(m.group(1), whole.group(0) if whole else "${oc.env:" + m.group(1) + "}")

    _walk(OmegaConf.to_container(cfg, resolve=False), visit)
    found: dict[str, str] = {}
    for name in sorted(texts):
        value = os.environ.get(name)
        if value is not None and len(value) >= MIN_LENGTH:
            found.setdefault(value, texts[name])
    return found


def _walk(value: Any, visit: Callable[[str], None]) -> None:
    if isinstance(value, str):
        visit(value)
    elif isinstance(value, dict):
        for v in value.values():
            _walk(v, visit)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _walk(v, visit)


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
