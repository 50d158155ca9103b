"""Where self.log records, hook by hook: a task and a callback log from every hook and step that Lightning
defines, with the default options, with on_step or on_epoch alone and with both; Lightning 2.6 runs the same
code. Both must refuse the same calls and end each stage (fit, a resumed fit, validate with one loader and
with two, test, predict) with the same trainer.callback_metrics keys."""

from __future__ import annotations

import glob
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning")

# hooks of the task's that it overrides and logs from (it also logs from its steps and optimizer methods)
TASK_HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_train_epoch_start",
    "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end", "on_validation_start", "on_validation_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_start", "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start",
    "on_test_batch_end", "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_save_checkpoint", "on_load_checkpoint",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "on_validation_model_eval",
    "on_validation_model_train", "on_validation_model_zero_grad", "on_test_model_eval", "on_test_model_train",
    "configure_model", "prepare_data", "backward", "optimizer_step", "optimizer_zero_grad",
    "configure_gradient_clipping", "lr_scheduler_step",
)  # fmt: skip
CALLBACK_HOOKS = ("on_sanity_check_start", "on_sanity_check_end") + tuple(
    h for h in TASK_HOOKS if h.startswith("on_") and "model_" not in h and "transfer" not in h
)
VARIANTS = {
    "default": {},
    "step": {"on_step": True, "on_epoch": False},
    "epoch": {"on_step": False, "on_epoch": True},
    "both": {"on_step": True, "on_epoch": True},
}


def _classes(base: type, callback_base: type, outcome: dict[str, str]) -> tuple[type, type]:
    """A task class (of `base`) and a callback class that log from every hook into `outcome`."""

    def attempt(owner: str, fx: str, module: object) -> None:
        for variant, options in VARIANTS.items():
            try:
                module.log(f"{owner}/{fx}/{variant}", torch.tensor(1.0), **options)
            except Exception as e:  # noqa: BLE001 (which exception differs: Lightning's or ours)
                outcome[f"{owner}:{fx}:{variant}"] = f"refused ({type(e).__name__})"
            else:
                outcome.setdefault(f"{owner}:{fx}:{variant}", "ok")

    def task_hook(fx: str):  # noqa: ANN202
        def hook(self, *args, **kwargs):  # noqa: ANN001, ANN202
            attempt("task", fx, self)
            return getattr(super(Logs, self), fx)(*args, **kwargs)

        return hook

    def step(fx: str, returns):  # noqa: ANN001, ANN202
        def run(self, batch, batch_idx, dataloader_idx=0):  # noqa: ANN001, ANN202
            attempt("task", fx, self)
            return returns(self, batch)

        return run

    def configure_optimizers(self):  # noqa: ANN001, ANN202
        attempt("task", "configure_optimizers", self)
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    def init(self) -> None:  # noqa: ANN001
        base.__init__(self)
        self.net = torch.nn.Linear(2, 1)

    namespace = {fx: task_hook(fx) for fx in TASK_HOOKS}
    namespace.update(
        __init__=init,
        configure_optimizers=configure_optimizers,
        training_step=step("training_step", lambda self, b: self.net(b[0]).pow(2).mean()),
        validation_step=step("validation_step", lambda self, b: None),
        test_step=step("test_step", lambda self, b: None),
        predict_step=step("predict_step", lambda self, b: b[0]),
    )
    Logs = type("Logs", (base,), namespace)

    def callback_hook(fx: str):  # noqa: ANN202
        def hook(self, trainer, module, *args, **kwargs):  # noqa: ANN001, ANN202
            attempt("callback", fx, module)

        return hook

    Logging = type("Logging", (callback_base,), {fx: callback_hook(fx) for fx in CALLBACK_HOOKS})
    return Logs, Logging


def _data() -> DataLoader:
    return DataLoader(
        TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))), batch_size=4
    )


def _run(framework: str, root: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Every stage under `framework`: what each attempt did, and each stage's callback_metrics keys."""
    outcome: dict[str, str] = {}
    if framework == "lightning":
        Logs, Logging = _classes(pl.LightningModule, pl.Callback, outcome)
        make, csv = pl.Trainer, pl.loggers.CSVLogger
    else:
        from callbacks import Callback
        from trainer import Task, Trainer
        from trainer.loggers import CSVLogger

        Logs, Logging = _classes(Task, Callback, outcome)
        make, csv = Trainer, CSVLogger

    def trainer(**options: object) -> object:
        return make(
            accelerator="cpu", default_root_dir=root, enable_progress_bar=False, enable_model_summary=False,
            logger=csv(root), log_every_n_steps=1, callbacks=[Logging()], **options,
        )  # fmt: skip

    keys: dict[str, list[str]] = {}

    def record(stage: str, t: object) -> None:  # what callbacks see, and what reached the logger
        keys[stage] = sorted(t.callback_metrics)
        keys[f"{stage}, logged"] = sorted(t.logged_metrics)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trainer(max_epochs=1, num_sanity_val_steps=1)
        t.fit(Logs(), _data(), _data())
        record("fit", t)
        (saved,) = glob.glob(f"{root}/**/*.ckpt", recursive=True)
        t = trainer(max_epochs=2, num_sanity_val_steps=0)
        t.fit(Logs(), _data(), _data(), ckpt_path=saved)
        record("resumed fit", t)
        for stage in ("validate", "test", "predict"):
            t = trainer()
            getattr(t, stage)(Logs(), _data())
            record(stage, t)
        t = trainer()
        t.validate(Logs(), [_data(), _data()])  # two loaders: every key gets its loader's suffix
        record("validate, two loaders", t)
    return outcome, keys


def test_self_log_is_refused_and_recorded_in_the_same_hooks_as_lightnings(tmp_path):
    lightning, keys_lightning = _run("lightning", str(tmp_path / "lightning"))
    tandem, keys_tandem = _run("tandem", str(tmp_path / "tandem"))
    refused = {k: "refused" if v.startswith("refused") else v for k, v in lightning.items()}
    ours = {k: "refused" if v.startswith("refused") else v for k, v in tandem.items()}
    assert len(refused) > 350  # every hook was reached in both
    assert {k: v for k, v in ours.items() if refused.get(k) != v} == {}
    assert set(refused) == set(ours)
    assert keys_tandem == keys_lightning
    assert all(v in ("ok", "refused (TaskError)") for v in tandem.values())
