"""atomic_write, and the loggers' files written through it: all or nothing, never a mix of two writers."""

from __future__ import annotations

import csv
import io
import os
import threading
import time

import pytest
import yaml

import trainer.loggers.base as logger_base
import trainer.loggers.csv_logs as csv_logs
from tandem_core.fileio import atomic_write
from trainer.loggers import CSVLogger


def run_threads(*targets) -> None:
    """Run `targets` in threads; re-raise the first exception any of them raised."""
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # handed to the main thread
                errors.append(e)

        return run

    threads = [threading.Thread(target=guard(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x00\xffbytes", b"\x00\xffbytes"),
        ("text: \u00e9\u4e2d", "text: \u00e9\u4e2d".encode()),
        (lambda f: (f.write(b"by "), f.write(b"a function")), b"by a function"),
    ],
    ids=["bytes", "str", "callable"],
)
def test_writes_bytes_text_and_functions_and_replaces_the_old_file(tmp_path, data, expected):
    path = tmp_path / "new" / "dir" / "file"
    atomic_write(path, b"old")
    atomic_write(str(path), data)
    assert path.read_bytes() == expected
    assert os.listdir(path.parent) == ["file"]


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failing_writer_leaves_the_old_file_and_no_temporary_file(tmp_path, exc):
    path = tmp_path / "f.txt"
    atomic_write(path, "old")

    def writer(f):
        f.write(b"half of the new cont")
        raise exc

    with pytest.raises(type(exc)):
        atomic_write(path, writer)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_a_failing_rename_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    atomic_write(path, "old")

    def refuse(src, dst):
        raise PermissionError("read-only")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError):
        atomic_write(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_two_writers_to_one_path_never_mix(tmp_path):
    """Each writer writes its payload in small pieces, yielding in between; readers only ever see a whole one."""
    path = tmp_path / "shared.bin"
    payloads = {name: name * 64 * 1024 for name in (b"A", b"B")}
    atomic_write(path, payloads[b"A"])
    seen: set[bytes] = set()
    done = threading.Event()

    def writer(payload: bytes):
        def write(f):
            for i in range(0, len(payload), 4096):
                f.write(payload[i : i + 4096])
                time.sleep(0)  # let the other writer run in the middle of this file

        def loop():
            for _ in range(40):
                atomic_write(path, write)

        return loop

    def reader():
        while not done.is_set():
            content = path.read_bytes()
            assert content in payloads.values(), f"mixed or torn file: {set(content)}, {len(content)} bytes"
            seen.add(content[:1])

    write_a, write_b = writer(payloads[b"A"]), writer(payloads[b"B"])

    def writers():
        try:
            run_threads(write_a, write_b)
        finally:
            done.set()

    run_threads(writers, reader)
    assert path.read_bytes() in payloads.values()
    assert os.listdir(tmp_path) == ["shared.bin"]


# ----- the CSV logger --------------------------------------------------------------------------------------
def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_csv_logger_writes_every_file_through_atomic_write(tmp_path, monkeypatch):
    written: list[str] = []
    real = csv_logs.atomic_write
    spy = lambda p, d: (written.append(os.fspath(p)), real(p, d))  # noqa: E731
    monkeypatch.setattr(csv_logs, "atomic_write", spy)  # metrics.csv
    monkeypatch.setattr(logger_base, "atomic_write", spy)  # hparams.yaml (shared with TensorBoardLogger)
    logger = CSVLogger(str(tmp_path))
    logger.log_hyperparams({"lr": 0.1, "layers": [2, 3], "opt": {"name": "sgd"}})
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    logger.log_metrics({"a": 2.0}, step=1)
    logger.save()  # same columns: appended
    logger.log_metrics({"b": 3.0}, step=2)
    logger.save()  # a new column: rewritten
    hparams, metrics = os.path.join(logger.log_dir, "hparams.yaml"), logger.metrics_file
    assert written == [hparams, metrics, metrics]
    with open(hparams, encoding="utf-8") as f:
        assert yaml.safe_load(f) == {"lr": 0.1, "layers": [2, 3], "opt": {"name": "sgd"}}
    assert read_csv(metrics) == [
        {"step": "0", "a": "1.0", "b": ""},
        {"step": "1", "a": "2.0", "b": ""},
        {"step": "2", "a": "", "b": "3.0"},
    ]
    assert sorted(os.listdir(logger.log_dir)) == ["hparams.yaml", "metrics.csv"]


def test_two_csv_loggers_rewriting_one_file_never_mix(tmp_path):
    """Every save adds a column, so every save rewrites; the file always holds a whole table (the second
    logger keeps the rows it found in the file: a CSVLogger never drops a version's earlier rows)."""
    loggers = {name: CSVLogger(str(tmp_path), version=0) for name in ("a", "b")}
    done = threading.Event()

    def logging(name: str):
        def run():
            for step in range(60):
                loggers[name].log_metrics({f"{name}{step}": float(step)}, step=step)
                loggers[name].save()

        return run

    def reader():
        path = loggers["a"].metrics_file
        while not done.is_set():
            if not os.path.exists(path):
                continue
            with open(path, newline="", encoding="utf-8") as f:
                text = f.read()
            rows = list(csv.DictReader(io.StringIO(text)))
            assert all(None not in r and None not in r.values() for r in rows), "a torn row"
            assert all(r["step"].isdigit() for r in rows)

    def writers():
        try:
            run_threads(logging("a"), logging("b"))
        finally:
            done.set()

    run_threads(writers, reader)
    assert not [f for f in os.listdir(loggers["a"].log_dir) if f != "metrics.csv"]


@pytest.mark.parametrize("url", ["memory://run", "s3://bucket/run"])
def test_a_url_for_a_directory_is_refused_by_name_and_never_becomes_a_local_directory(
    tmp_path, monkeypatch, url
):
    """Lightning writes through fsspec; Tandem only to local (or mounted) file systems, and says so instead of
    turning ``s3://bucket/run`` into a local ``./s3:/bucket/run`` (Lightning's test_model_checkpoint_save_last_
    as_link_not_local raises its ValueError at setup: so does Tandem's ModelCheckpoint)."""
    from callbacks import ModelCheckpoint
    from tandem_core.errors import ConfigError
    from trainer import Trainer
    from trainer.demos import BoringModel
    from trainer.loggers import CSVLogger, TensorBoardLogger

    monkeypatch.chdir(tmp_path)
    for logger in (CSVLogger, TensorBoardLogger):
        with pytest.raises(ConfigError, match=f"{logger.__name__}'s save_dir '{url}' is a URL"):
            logger(save_dir=url)
    with pytest.raises(ValueError, match="default_root_dir must be a local path"):
        Trainer(default_root_dir=url)
    cb = ModelCheckpoint(dirpath=url, save_last="link")
    assert cb.dirpath == url
    with pytest.raises(ValueError, match="ModelCheckpoint's dirpath .* is a URL"):
        cb.setup(trainer=Trainer(), pl_module=BoringModel(), stage="fit")  # Lightning's keyword, too
    with pytest.raises(ConfigError, match="is a URL"):
        Trainer(callbacks=[ModelCheckpoint(dirpath=url)], max_steps=1, logger=False).fit(BoringModel())
    assert os.listdir(tmp_path) == []
