"""W&B and MLflow loggers in real fits, read back through each tracker's own client: offline W&B run files
(``wandb leet inspect``), MLflow file stores and a local ``mlflow server`` (``MlflowClient``). Metrics at
their steps equal the CSVLogger's of the same run; a resumed fit continues the same run with the losses of
an uninterrupted one; ddp x2 makes one run holding rank 0's metrics. Slow: each fit starts a tracker."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from callbacks import ModelCheckpoint
from tests.conftest import free_port
from tests.helpers.trackers import (
    QUIET,
    Small,
    loaders,
    mlflow_history,
    needs_mlflow,
    needs_wandb,
    read_csv,
    wandb_config,
    wandb_env,
    wandb_files,
    wandb_history,
    wandb_records,
)
from trainer import Trainer
from trainer.loggers import CSVLogger, MLFlowLogger, WandbLogger

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, everything under tmp_path; the run is closed after the test, and so is the wandb service
    this process started (wandb.init puts its address in os.environ["WANDB_SERVICE"], where the subprocess
    of a later test would find it and send its records to this process's service instead of its own)."""
    for k, v in wandb_env(str(tmp_path)).items():
        monkeypatch.setenv(k, v)
    yield str(tmp_path)
    import wandb

    wandb.finish()
    wandb.teardown()
    monkeypatch.delenv("WANDB_SERVICE", raising=False)


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps the file store behind this switch
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return str(tmp_path / "mlruns")


def _fit(tmp_path, loggers, epochs: int, ckpt_path: str | None = None, **kwargs) -> Trainer:
    trainer = Trainer(max_epochs=epochs, logger=loggers, default_root_dir=str(tmp_path), **QUIET, **kwargs)
    trainer.fit(Small(lr=0.05), *loaders(), ckpt_path=ckpt_path)
    return trainer


def _csv(tmp_path, name: str = "csv") -> CSVLogger:
    return CSVLogger(str(tmp_path), name=name)


# ----- W&B -----------------------------------------------------------------------------------------
@needs_wandb
def test_wandb_offline_run_holds_the_metrics_at_their_steps_and_the_config(tmp_path, offline_wandb):
    import wandb

    wl, csv_logger = WandbLogger(project="digits", name="first", save_dir=str(tmp_path)), _csv(tmp_path)
    trainer = _fit(tmp_path, [wl, csv_logger], epochs=2)
    run_id = wl.version
    wandb.finish()
    assert trainer.checkpoint_callback.dirpath == os.path.join(str(tmp_path), "digits", run_id, "checkpoints")
    (path,) = wandb_files(str(tmp_path), run_id)
    records = wandb_records(path)
    history = wandb_history(records)
    assert set(history) == {"train/loss", "val/loss", "rank", "epoch"}
    assert history == read_csv(csv_logger.metrics_file)  # same values at the same steps
    assert [s for s, _ in history["train/loss"]] == list(range(6))  # 3 steps an epoch
    assert [s for s, _ in history["val/loss"]] == [2, 5]
    assert wandb_config(records) == {"lr": 0.05, "hidden": 8}
    run = next(r["run"] for r in records if r["type"] == "run")
    assert (run["project"], run["run_id"], run["display_name"]) == ("digits", run_id, "first")


def _artifacts(records: list[dict]) -> list[tuple[int, dict]]:
    """(how many history rows came before it, artifact record) for each logged artifact."""
    out, rows = [], 0
    for r in records:
        rows += r["type"] == "history"
        if r["type"] == "artifact":
            out.append((rows, r["artifact"]))
    return out


@needs_wandb
@pytest.mark.parametrize("log_model", [True, "all"])
def test_wandb_log_model_uploads_checkpoints_as_lightning_does(tmp_path, offline_wandb, log_model):
    """True: the best and last checkpoints once, at the end; "all": each one right after it is saved."""
    import wandb

    wl = WandbLogger(project="digits", save_dir=str(tmp_path), log_model=log_model)
    ckpt = ModelCheckpoint(monitor="val/loss", save_last=True)
    trainer = _fit(tmp_path, [wl], epochs=2, callbacks=[ckpt])
    run_id = wl.version
    wandb.finish()
    records = wandb_records(wandb_files(str(tmp_path), run_id)[0])
    artifacts = _artifacts(records)
    rows = sum(r["type"] == "history" for r in records)
    for _, art in artifacts:
        assert (art["name"], art["type"], art["run_id"]) == (f"model-{run_id}", "model", run_id)
        (entry,) = art["manifest"]["contents"]
        assert entry["path"] == "model.ckpt"
        meta = json.loads(art["metadata"])
        assert meta["ModelCheckpoint"]["monitor"] == "val/loss"
        original = os.path.join(ckpt.dirpath, meta["original_filename"])
        if os.path.exists(original):  # (a top-1 file replaced later is gone)
            assert int(entry["size"]) == os.path.getsize(original)
    names = [json.loads(a["metadata"])["original_filename"] for _, a in artifacts]
    best = os.path.basename(trainer.checkpoint_callback.best_model_path)
    if log_model is True:  # at the end, after every metric row
        assert sorted(names) == sorted(["last.ckpt", best]) and all(n == rows for n, _ in artifacts)
    else:  # epoch 0: its file and last; epoch 1: its file (if better) and last again
        assert names[:2] == ["epoch=0-step=3.ckpt", "last.ckpt"] and names[-1] == "last.ckpt"
        assert artifacts[0][0] < rows
    best_aliases = [
        a["aliases"] for _, a in artifacts if json.loads(a["metadata"])["original_filename"] == best
    ]
    assert {"latest", "best"} in [set(a) for a in best_aliases]


@needs_wandb
def test_wandb_resume_continues_the_same_run_with_an_uninterrupted_runs_losses(tmp_path, offline_wandb):
    import wandb

    reference = _csv(tmp_path, "reference")
    _fit(tmp_path / "ref", [reference], epochs=2)  # the uninterrupted run
    first = WandbLogger(project="digits", save_dir=str(tmp_path))
    trainer = _fit(tmp_path, [first], epochs=1, callbacks=[ModelCheckpoint(save_last=True)])
    run_id, last = first.version, trainer.checkpoint_callback.last_model_path
    wandb.finish()
    time.sleep(1.1)  # W&B names a run's directory by the second it started
    second = WandbLogger(project="digits", save_dir=str(tmp_path), id=run_id)  # Lightning's way: the id
    _fit(tmp_path, [second], epochs=2, ckpt_path=last, callbacks=[ModelCheckpoint(save_last=True)])
    assert second.version == run_id
    wandb.finish()
    files = wandb_files(str(tmp_path), run_id)
    assert len(files) == 2  # one transaction log per start, both of run `run_id` (wandb sync joins them)
    before, after = (wandb_history(wandb_records(f)) for f in files)
    assert [s for s, _ in before["train/loss"]] == [0, 1, 2]
    assert [s for s, _ in after["train/loss"]] == [3, 4, 5]
    expected = read_csv(reference.metrics_file)["train/loss"]
    resumed = before["train/loss"] + after["train/loss"]
    assert [s for s, _ in resumed] == [s for s, _ in expected]
    assert [v for _, v in resumed] == pytest.approx([v for _, v in expected], rel=1e-6)
    for f in files:
        run = next(r["run"] for r in wandb_records(f) if r["type"] == "run")
        assert run["run_id"] == run_id


# ----- MLflow --------------------------------------------------------------------------------------
def _check_mlflow_run(client, run_id: str, csv_logger: CSVLogger, ckpt: ModelCheckpoint, tmp_path) -> None:
    """Metrics at CSVLogger's steps, params, FINISHED, and the best and last checkpoints as artifacts."""
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.05", "hidden": "8"}
    reference = read_csv(csv_logger.metrics_file)
    for key in ("train/loss", "val/loss", "rank"):
        assert mlflow_history(client, run_id, key) == reference[key]
    folders = {a.path for a in client.list_artifacts(run_id)}
    stems = {os.path.splitext(os.path.basename(p))[0] for p in ("last.ckpt", ckpt.best_model_path)}
    assert folders == stems
    for stem in stems:
        assert {a.path for a in client.list_artifacts(run_id, stem)} == {
            f"{stem}/{stem}.ckpt",
            f"{stem}/metadata.yaml",
            f"{stem}/aliases.txt",
        }
        local = client.download_artifacts(run_id, f"{stem}/{stem}.ckpt", str(tmp_path / "download"))
        with open(local, "rb") as a, open(os.path.join(ckpt.dirpath, f"{stem}.ckpt"), "rb") as b:
            assert a.read() == b.read()


@needs_mlflow
def test_mlflow_file_store_holds_metrics_params_and_checkpoints(tmp_path, file_store):
    from mlflow.tracking import MlflowClient

    ml = MLFlowLogger("digits", run_name="first", save_dir=file_store, log_model=True)
    csv_logger, ckpt = _csv(tmp_path), ModelCheckpoint(monitor="val/loss", save_last=True)
    _fit(tmp_path, [ml, csv_logger], epochs=2, callbacks=[ckpt])
    assert ckpt.dirpath == os.path.join(file_store, ml.experiment_id, ml.run_id, "checkpoints")  # Lightning's
    client = MlflowClient(f"file:{file_store}")
    assert client.get_run(ml.run_id).info.run_name == "first"
    _check_mlflow_run(client, ml.run_id, csv_logger, ckpt, tmp_path)


@needs_mlflow
def test_mlflow_resume_continues_the_same_run_with_an_uninterrupted_runs_losses(tmp_path, file_store):
    from mlflow.tracking import MlflowClient

    reference = _csv(tmp_path, "reference")
    _fit(tmp_path / "ref", [reference], epochs=2)
    first = MLFlowLogger("digits", save_dir=file_store)
    trainer = _fit(tmp_path, [first], epochs=1, callbacks=[ModelCheckpoint(save_last=True)])
    client = MlflowClient(f"file:{file_store}")
    before = mlflow_history(client, first.run_id, "train/loss")
    assert [s for s, _ in before] == [0, 1, 2]
    second = MLFlowLogger("digits", save_dir=file_store, run_id=first.run_id)
    last = trainer.checkpoint_callback.last_model_path
    _fit(tmp_path, [second], epochs=2, ckpt_path=last, callbacks=[ModelCheckpoint(save_last=True)])
    assert second.run_id == first.run_id
    assert len(client.search_runs([first.experiment_id])) == 1  # no second run
    resumed = mlflow_history(client, first.run_id, "train/loss")
    expected = read_csv(reference.metrics_file)["train/loss"]
    assert resumed[:3] == before and [s for s, _ in resumed] == [s for s, _ in expected]
    assert [v for _, v in resumed] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert client.get_run(first.run_id).info.status == "FINISHED"


@needs_mlflow
def test_mlflow_against_a_local_tracking_server(tmp_path, monkeypatch):
    """`mlflow server` on 127.0.0.1 (sqlite backend, artifacts served by the server), stopped after."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    cmd += ["--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    cmd += ["--artifacts-destination", str(tmp_path / "served-artifacts")]
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"mlflow server exited with {proc.returncode}: {(tmp_path / 'server.log').read_text()}"
                )
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.5)
        ml = MLFlowLogger("digits", tracking_uri=uri, log_model=True)
        assert ml.save_dir is None
        csv_logger, ckpt = _csv(tmp_path), ModelCheckpoint(monitor="val/loss", save_last=True)
        _fit(tmp_path, [ml, csv_logger], epochs=2, callbacks=[ckpt])
        assert ckpt.dirpath == os.path.join(str(tmp_path), "checkpoints")  # no local store: default_root_dir
        _check_mlflow_run(MlflowClient(uri), ml.run_id, csv_logger, ckpt, tmp_path)
        assert os.listdir(tmp_path / "served-artifacts")  # the server stored the uploads
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        log.close()


# ----- ddp x2 --------------------------------------------------------------------------------------
@needs_wandb
@needs_mlflow
def test_ddp_two_processes_make_one_run_with_rank_zeros_metrics(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    env = {**os.environ, **wandb_env(str(tmp_path)), "PYTHONPATH": os.path.dirname(HERE)}
    # rank 0 starts its own wandb service: with a WANDB_SERVICE inherited from this process (an earlier
    # in-process W&B test), its records went to that service, which had not written them when read (CI)
    env.pop("WANDB_SERVICE", None)
    script = os.path.join(HERE, "scripts", "tracker_ddp.py")
    done = subprocess.run(
        [sys.executable, script, str(tmp_path)], env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = json.load(open(tmp_path / "ids.json"))
    assert ids["world_size"] == 2
    reference = read_csv(ids["csv"])  # rank 0's rows: 5 samples a rank, 2 steps an epoch
    assert [s for s, _ in reference["train/loss"]] == [0, 1, 2, 3]
    assert {v for _, v in reference["rank"]} == {0.0}
    assert len(glob.glob(str(tmp_path / "wandb" / "*run-*"))) == 1  # one W&B run, rank 0's
    history = wandb_history(wandb_records(wandb_files(str(tmp_path), ids["wandb"])[0]))
    assert history == reference
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ddp").experiment_id])
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    for key in ("train/loss", "rank"):
        assert mlflow_history(client, run.info.run_id, key) == reference[key]


@needs_mlflow
def test_mlflow_says_what_to_change(tmp_path, monkeypatch):
    """A file store this mlflow refuses, and params a resumed run would change (MLflow keeps them)."""
    from tandem_core.errors import ConfigError

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    import mlflow

    if int(mlflow.__version__.split(".")[0]) >= 3:  # the file store refusal came with mlflow 3
        with pytest.raises(ConfigError, match="tracking_uri='sqlite:///mlflow.db'.*MLFLOW_ALLOW_FILE_STORE"):
            MLFlowLogger(save_dir=str(tmp_path / "refused")).experiment  # noqa: B018
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    ml = MLFlowLogger(save_dir=str(tmp_path / "mlruns"))
    ml.log_hyperparams({"lr": 0.1, "model": {"hidden": 8}})
    with pytest.warns(UserWarning, match=r"keeps lr: '0.1' \(now '0.2'\)"):
        MLFlowLogger(save_dir=str(tmp_path / "mlruns"), run_id=ml.run_id).log_hyperparams(
            {"lr": 0.2, "seed": 1}
        )
    params = ml.experiment.get_run(ml.run_id).data.params
    assert params == {"lr": "0.1", "model/hidden": "8", "seed": "1"}
