"""pytest plugin of the Lightning-suite runner (loaded with ``-p plugin``; LIGHTNING_SUITE_MODE picks the run).

It installs the import aliases before any conftest loads, relaxes ``pytest.raises(match=...)`` and
``pytest.warns(match=...)`` under the Tandem run (the exception or warning class must still match, in the same block;
only the words may differ), bounds each test's time, and
writes one JSON line per test to LIGHTNING_SUITE_OUT: outcome, whether a relaxed match was needed, and for a failure
its class ("internal" or "behaviour") and reason (tools/lightning_suite/classify.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import alias  # noqa: E402
import classify  # noqa: E402

MODE = os.environ.get("LIGHTNING_SUITE_MODE", "lightning")
OUT = os.environ.get("LIGHTNING_SUITE_OUT", os.devnull)
TIMEOUT = int(os.environ.get("LIGHTNING_SUITE_TIMEOUT", "90"))
alias.install(MODE)
_relaxed: set[str] = set()
_current: list[str] = [""]
_ORIGINAL_RAISES = pytest.raises


class _Relaxed:
    """pytest.raises(cls) whose `match` is only recorded: a message mismatch marks the test as relaxed."""

    def __init__(self, cm: Any, match: Any) -> None:
        self.cm, self.match = cm, match

    def __enter__(self) -> Any:
        self.info = self.cm.__enter__()
        return self.info

    def __exit__(self, *exc: Any) -> Any:
        suppressed = self.cm.__exit__(*exc)
        if suppressed and not re.search(self.match, str(self.info.value)):
            if isinstance(exc[1], AttributeError) and (classify.failure_of(exc[1]) or ("",))[0] == "internal":
                return (
                    False  # the code reached a Lightning internal (trainer.fit_loop): not the awaited error
                )
            _relaxed.add(_current[0])
        return suppressed


def _raises(expected: Any, *args: Any, match: Any = None, **kwargs: Any) -> Any:
    if match is None or args:
        return _ORIGINAL_RAISES(expected, *args, match=match, **kwargs)
    return _Relaxed(_ORIGINAL_RAISES(expected, **kwargs), match)


class _RelaxedWarns:
    """pytest.warns(cls, match=...) that passes when a warning of the class is emitted in the block, whatever its
    words; a test that needed that is marked relaxed. Two kinds of warning never stand in for the awaited one:
    torch's own (a deprecation of what the code calls, torch.jit.script) and a generic hint of the run
    (PossibleUserWarning: too few loader workers, a short epoch) when the test awaits another class. A block that
    raises fails with its own error (pytest's checker would report "DID NOT WARN" and hide, for example, a
    Lightning internal the block reached)."""

    def __init__(self, expected: Any, match: Any) -> None:
        self.cm, self.match, self.expected = _ORIGINAL_WARNS(expected), match, expected

    def __enter__(self) -> Any:
        return self.cm.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            result = self.cm.__exit__(*exc)
        except pytest.fail.Exception:
            if exc[0] is not None:  # the block raised: that error is the failure, not pytest's "DID NOT WARN"
                return False
            raise
        if self.match is None:
            return result
        if exc[0] is None and not any(re.search(self.match, str(w.message)) for w in self.cm):
            if not any(self._stands_in(w) for w in self.cm):
                pytest.fail(
                    f"DID NOT WARN: no {self.expected} matching {self.match!r}, and none of the class other than "
                    "torch's own or a generic hint (PossibleUserWarning)"
                )
            _relaxed.add(_current[0])
        return result

    def _stands_in(self, w: Any) -> bool:
        """Whether `w`, of other words, may stand in for the awaited warning (see the class)."""
        from trainer.utilities.enums import PossibleUserWarning

        awaited = self.expected if isinstance(self.expected, tuple) else (self.expected,)
        generic = issubclass(w.category, PossibleUserWarning) and not any(
            issubclass(a, PossibleUserWarning) for a in awaited
        )
        return issubclass(w.category, awaited) and not generic and not w.filename.startswith(_TORCH_DIR)


_TORCH_DIR = os.path.join(os.path.dirname(torch.__file__), "")


def _deprecated_call(*args: Any, match: Any = None, **kwargs: Any) -> Any:
    """pytest.deprecated_call(match=...) relaxed as pytest.warns is; a deprecation warning torch itself emits
    (its own package's) does not stand in for the one awaited."""
    if match is None or args or kwargs:
        return _ORIGINAL_DEPRECATED_CALL(*args, match=match, **kwargs)
    return _RelaxedWarns((DeprecationWarning, PendingDeprecationWarning, FutureWarning), match)


def _warns(expected: Any = Warning, *args: Any, match: Any = None, **kwargs: Any) -> Any:
    if args or kwargs:
        return _ORIGINAL_WARNS(expected, *args, match=match, **kwargs)
    return _RelaxedWarns(expected, match)


_ORIGINAL_WARNS = pytest.warns
_ORIGINAL_DEPRECATED_CALL = pytest.deprecated_call
# a test parametrized by these functions gets its id from their names (`test_x[2-warns]`), as under Lightning
_raises.__name__, _warns.__name__, _deprecated_call.__name__ = "raises", "warns", "deprecated_call"
if MODE == "tandem":
    pytest.raises = _raises  # type: ignore[assignment]
    pytest.warns = _warns  # type: ignore[assignment]
    pytest.deprecated_call = _deprecated_call  # type: ignore[assignment]
    import shims  # noqa: E402  (the runner also loads it with -p shims: its fixtures replace Lightning's conftest)

    shims.install()


def pytest_make_parametrize_id(config: Any, val: Any, argname: str) -> str | None:
    """Under the Tandem run, a parameter that is a Tandem object standing for a Lightning one of another name
    (Task for LightningModule) gets Lightning's id, so that both runs name the test alike."""
    return alias.lightning_name(val) if MODE == "tandem" and isinstance(val, type) else None


def _write(row: dict[str, Any]) -> None:
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    _current[0] = item.nodeid

    def alarm(*_: Any) -> None:
        raise TimeoutError(f"test exceeded {TIMEOUT}s (runner's per-test limit)")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Item) -> Any:
    """A KeyboardInterrupt raised by the code under test (not by a person: that one arrives as a signal between
    tests too) fails that test instead of ending the whole run, so that every later test is still counted."""
    try:
        return (yield)
    except KeyboardInterrupt as e:
        raise RuntimeError("KeyboardInterrupt raised inside the test reached pytest") from e


_failed: dict[str, dict[str, Any]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.nodeid not in _failed:
        kind, reason = classify.failure(item, call.excinfo)
        _failed[item.nodeid] = {"class": kind, "reason": reason}


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    pass


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    nodeid = report.nodeid
    row: dict[str, Any] = {"nodeid": nodeid, "file": nodeid.split("::")[0]}
    if nodeid in _failed:
        row.update(outcome="failed", **_failed[nodeid])
    elif getattr(report, "_suite_skipped", False):
        row["outcome"] = "skipped"
    else:
        row["outcome"] = _outcomes.get(nodeid, "passed")
    row["relaxed"] = nodeid in _relaxed
    _write(row)


_outcomes: dict[str, str] = {}


@pytest.hookimpl(trylast=True)
def pytest_report_teststatus(report: pytest.TestReport, config: Any) -> None:
    if report.when in ("setup", "call") and report.skipped:
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and hasattr(report, "wasxfail"):
        _outcomes[report.nodeid] = "skipped" if report.skipped else "passed"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        kind, reason = classify.collection(str(report.longrepr))
        _write({"nodeid": report.nodeid, "file": report.nodeid, "outcome": "collect_error", "class": kind,
                "reason": reason})  # fmt: skip
