"""`make lint`: no function of the training loop (trainer/loop/) above cyclomatic complexity 25, as radon counts it
(each if/elif/for/while/except/with, boolean operator, conditional expression and comprehension adds one);
functions nested in others (the per-epoch step closures) count on their own.

    python tools/complexity.py                      # trainer/loop, at most 25
    python tools/complexity.py trainer/loop 25 --show 10   # and the 10 most complex functions

Why: the loop stays readable in one place (docs/concepts.md, "The training loop"); for scale, Lightning's
_TrainingEpochLoop.advance counts 18 and torchtnt's _train_epoch_impl 13.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

from radon.complexity import cc_visit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blocks(items: list[Any], owner: str = "") -> Iterator[tuple[str, int, int]]:
    """(qualified name, line, complexity) of every function, method and nested function (radon lists a class's
    methods on their own too: the class itself, whose number is their mean, is left out)."""
    for item in items:
        if hasattr(item, "methods"):
            continue
        name = f"{owner}{item.fullname}"
        yield name, item.lineno, item.complexity
        yield from _blocks(getattr(item, "closures", []), f"{name}.")


def measure(folder: str) -> list[tuple[int, str]]:
    """Every function under `folder` as (complexity, "path:line name"), most complex first."""
    found = []
    for base, _, files in os.walk(os.path.join(ROOT, folder)):
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = os.path.join(base, file)
            with open(path) as f:
                source = f.read()
            rel = os.path.relpath(path, ROOT)
            found += [(cc, f"{rel}:{line} {name}") for name, line, cc in _blocks(cc_visit(source))]
    return sorted(found, reverse=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", default="trainer/loop")
    p.add_argument("limit", nargs="?", type=int, default=25)
    p.add_argument("--show", type=int, default=0, help="also list the N most complex functions")
    args = p.parse_args(argv)
    found = measure(args.folder)
    for cc, where in found[: args.show]:
        print(f"{cc:4d}  {where}")
    over = [(cc, where) for cc, where in found if cc > args.limit]
    for cc, where in over:
        print(
            f"{where}: cyclomatic complexity {cc} > {args.limit}; split it (docs/concepts.md)",
            file=sys.stderr,
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
