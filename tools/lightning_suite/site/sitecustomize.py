"""Imported at the start of every Python process the runner's tests start (the runner puts this directory on
PYTHONPATH): a process spawned by a test (`strategy="ddp_spawn"`'s workers, a script run by `subprocess`) unpickles
or imports the test's module, so it needs the same `lightning` alias (and, under the Tandem run, the same RunIf
shim) as the pytest process itself."""

from __future__ import annotations

import os
import sys

_MODE = os.environ.get("LIGHTNING_SUITE_MODE")
if _MODE in ("lightning", "tandem"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import alias

    alias.install(_MODE)
    if _MODE == "tandem":
        import shims

        shims.install()
