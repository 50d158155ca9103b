"""tools/lightning_suite's runner without running Lightning's tests: which files it selects, which flags take the
installed Lightning's value, how a failure is classified (internal / mocked / behaviour), and Lightning's names
for Tandem's classes in test ids."""

from __future__ import annotations

import sys
import types

import pytest
from conftest import ROOT

pytest.importorskip("pytorch_lightning")
sys.path.append(f"{ROOT}/tools/lightning_suite")
import absent  # noqa: E402
import classify  # noqa: E402
import run  # noqa: E402


def test_the_file_list_is_every_test_file_but_the_excluded(tmp_path):
    base = tmp_path / "tests_pytorch"
    for rel in ("trainer/test_trainer.py", "accelerators/test_gpu.py", "graveyard/test_tpu.py",
                "loggers/test_comet.py", "loggers/test_csv.py", "helpers/datasets.py", "test_cli.py"):  # fmt: skip
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text("")
    assert run.select(str(base), None) == [
        "tests_pytorch/loggers/test_csv.py", "tests_pytorch/test_cli.py", "tests_pytorch/trainer/test_trainer.py",
    ]  # fmt: skip
    assert run.select(str(base), ["accelerators/test_gpu.py"]) == ["tests_pytorch/accelerators/test_gpu.py"]
    assert run.excluded("graveyard/test_tpu.py") and run.excluded("trainer/test_trainer.py") is None


@pytest.mark.parametrize(
    ("name", "flag"),
    [("_IS_WINDOWS", True), ("_TORCH_EQUAL_2_9", True), ("_TORCH_GREATER_EQUAL_2_6", True), ("_KINETO_AVAILABLE", True),
     ("_JSONARGPARSE_SIGNATURES_AVAILABLE", True), ("_TM_GE_0_11", True), ("_CPU_PERCENT", False), ("_Loop", False)],
)  # fmt: skip
def test_environment_flags_are_told_by_name(name, flag):
    assert bool(absent._FLAG.match(name)) is flag


def _failure(source: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    namespace: dict = {}
    exec(source, namespace)
    item = types.SimpleNamespace(obj=namespace["test_x"], path="nowhere.py")
    try:
        raise AssertionError("a public result differs")
    except AssertionError as e:
        excinfo = types.SimpleNamespace(value=e, traceback=[])
    monkeypatch.setattr(classify, "_test_source", lambda item: source)  # inspect cannot read exec'd code
    return classify.failure(item, excinfo)


def test_a_failure_is_internal_only_when_the_test_touches_a_private(monkeypatch):
    private = 'def test_x():\n    with mock.patch("lightning.pytorch.callbacks.EarlyStopping._run_early_stopping_check"): pass\n'
    mocked = 'def test_x():\n    with mock.patch("lightning.pytorch.accelerators.cpu.get_cpu_stats"): pass\n'
    foreign = 'def test_x():\n    with mock.patch("lightning.pytorch.core.datamodule.DataLoader"): pass\n'
    public = 'def test_x():\n    with mock.patch("lightning.pytorch.Trainer.fit"): pass\n'
    assert _failure(private, monkeypatch)[0] == "internal"
    assert _failure(mocked, monkeypatch) == (
        "mocked",
        "mocks Lightning internal lightning.pytorch.accelerators.cpu.get_cpu_stats",
    )
    assert (
        _failure(foreign, monkeypatch)[0] == "mocked"
        and "another library" in _failure(foreign, monkeypatch)[1]
    )
    assert _failure(public, monkeypatch) == ("behaviour", "AssertionError: a public result differs")


def test_tandem_classes_get_lightnings_names_in_test_ids():
    import alias

    from trainer import DataModule, Task

    assert (
        alias.lightning_name(Task) == "LightningModule"
        and alias.lightning_name(DataModule) == "LightningDataModule"
    )
    assert alias.lightning_name(int) is None


def test_a_behaviour_failure_counts_as_documented_only_when_named_outside_the_table_and_open(tmp_path):
    doc = tmp_path / "porting.md"
    doc.write_text(
        "intro test_named\n### Open\ntest_open is known\n### Deliberate\n- test_deliberate: why\n"
        f"{run.BEGIN}\ntest_in_table\n{run.END}\n"
    )
    rows = {
        f"tests_pytorch/a/test_x.py::{name}": {"file": "tests_pytorch/a/test_x.py", "outcome": "passed"}
        for name in ("test_named", "test_open", "test_deliberate", "test_in_table", "test_ok")
    }
    tandem = {k: {"outcome": "failed", "class": "behaviour", "reason": "r"} for k in rows}
    tandem["tests_pytorch/a/test_x.py::test_ok"] = {"outcome": "passed"}
    files = ["tests_pytorch/a/test_x.py"]
    body, total = run.table(rows, tandem, "2.6.5", files, run.outside_table(str(doc)))
    assert (total["lightning"], total["tandem"], total["behaviour"], total["documented"]) == (5, 1, 4, 2)
    assert "2 are documented deliberate differences" in body and "and 2 are not" in body
    missing = run.undocumented(rows, tandem, files, str(doc))
    assert [m.split("::")[1] for m in missing] == ["test_in_table", "test_open"]


def test_a_test_counts_as_named_only_by_its_whole_name():
    text = "`callbacks/test_bar.py::test_bar_leave`, and `test_other[x]` (2)"
    assert run._named("f.py::test_bar_leave[3]", text) and run._named("f.py::test_other[x]", text)
    assert not run._named("f.py::test_bar[a]", text)  # a prefix of another test's name, or the file's name
    assert not run._named("f.py::test_bar_lea", text)
    assert run._named("f.py::test_x[Comet]", "`::test_x[Comet]`") and not run._named(
        "f.py::test_x[CSV]", "`::test_x[Comet]`"
    )
    assert run._named("f.py::test_w[False-True]", "`test_w[False-*]`") and not run._named(
        "f.py::test_w[True-1]", "`test_w[False-*]`"
    )
    assert run._named("f.py::test_restart_with_val_parity", "`test_restart*_parity` (4)")
    assert not run._named(
        "f.py::test_y", "every `test_*.py` file, `graveyard/test_x*.py`"
    )  # files, not tests


def test_a_failing_statement_on_a_name_bound_to_a_private_is_internal():
    source = "def test_x():\n    cl = CombinedLoader([1])\n    iterator = cl._iterator\n    assert iterator.state == {}\n"
    assert classify._reaches_private("assert iterator.state == {}", source)
    assert classify._reaches_private("cl._load_state_dicts([])", source)
    assert not classify._reaches_private("assert cl.state == {}", source)
    mocked = "def test_y():\n    stateful = Mock(spec=_Stateful)\n    other = Mock()\n"
    assert classify._reaches_private("stateful.load_state_dict.assert_not_called()", mocked)
    assert not classify._reaches_private("other.load_state_dict.assert_not_called()", mocked)


def test_a_workers_failure_on_a_private_in_the_tests_file_is_internal():
    class Remote(Exception):
        text = (
            'Traceback:\n  File "/t/test_all.py", line 214, in setup\n    assert trainer.logger._experiment\n'
        )

    try:
        raise AssertionError() from Remote()
    except AssertionError as e:
        error = e
    item = types.SimpleNamespace(path="/t/test_all.py")
    assert classify._remote_line(item, error) == "assert trainer.logger._experiment"
    assert classify._reaches_private(classify._remote_line(item, error), "")
