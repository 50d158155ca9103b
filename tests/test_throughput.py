"""Throughput's rolling rates against arithmetic by hand, measure_flops against the FLOPs of a matmul, and
ThroughputMonitor's logged keys."""

from __future__ import annotations

import pytest
import torch
from callback_tasks import Scored, loader
from conftest import FAST
from test_device_stats import Recording

from callbacks import ThroughputMonitor
from callbacks.throughput.meter import Throughput, get_available_flops, measure_flops
from trainer import Trainer


def test_rates_over_the_window():
    tp = Throughput(available_flops=100.0, world_size=2, window_size=3)
    for i in range(1, 5):  # one batch of 4 samples (10 items, 50 FLOPs) per 0.5 s
        tp.update(time=0.5 * i, batches=i, samples=4 * i, lengths=10 * i, flops=50)
    out = tp.compute()
    assert out["time"] == 2.0 and out["batches"] == 4 and out["samples"] == 16 and out["lengths"] == 40
    assert out["device/batches_per_sec"] == pytest.approx(2.0) and out["batches_per_sec"] == pytest.approx(
        4.0
    )
    assert out["device/samples_per_sec"] == pytest.approx(8.0) and out[
        "device/items_per_sec"
    ] == pytest.approx(20.0)
    assert out["device/flops_per_sec"] == pytest.approx(100.0) and out["device/mfu"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="increase"):
        tp.update(time=0.1, batches=5, samples=20)


def test_measure_flops_counts_a_linear_layer():
    model = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(16, 8)
    assert measure_flops(model, lambda: model(x)) == 2 * 16 * 8 * 4
    assert (
        measure_flops(model, lambda: model(x), lambda y: y.sum()) == 2 * 2 * 16 * 8 * 4
    )  # + the weight grad
    assert get_available_flops(torch.device("cpu"), torch.float32) is None


def test_monitor_logs_train_and_validation_rates(tmp_path):
    logger = Recording(str(tmp_path))
    cb = ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0], window_size=2)
    with pytest.warns(UserWarning, match="flops_per_batch"):
        Trainer(max_epochs=2, callbacks=[cb], **{**FAST, "logger": logger, "log_every_n_steps": 1}).fit(
            Scored(), loader(8, 2), loader(4, 2)
        )
    keys = {k for _, m in logger.logged for k in m}
    assert {"train/samples", "train/device/samples_per_sec", "validate/batches", "train/time"} <= keys
    last = [m for _, m in logger.logged if "train/samples" in m][-1]
    assert last["train/samples"] == 16 and last["train/batches"] == 8


def _monitor_calls(lightning: bool, tmp_path) -> list:
    """Lightning's test_throughput_monitor_fit_with_validation run (a validation after each of 2 steps, a clock
    that advances by set amounts): the calls the logger gets."""
    from unittest import mock

    if lightning:
        pl = pytest.importorskip("pytorch_lightning")
        from pytorch_lightning.demos.boring_classes import BoringModel

        T, Monitor = pl.Trainer, pl.callbacks.ThroughputMonitor
    else:
        from trainer.demos import BoringModel

        T, Monitor = Trainer, ThroughputMonitor
    logger = mock.Mock(save_dir=str(tmp_path))
    t = T(logger=logger, callbacks=Monitor(batch_size_fn=lambda x: 1, window_size=2), max_steps=2,
          val_check_interval=1, log_every_n_steps=1, limit_val_batches=1, num_sanity_val_steps=2,
          enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)  # fmt: skip
    with mock.patch("time.perf_counter", side_effect=[0, 7, 11, 13, 19, 23, 29]):
        t.fit(BoringModel())
    return logger.log_metrics.mock_calls


def test_monitor_logs_lightnings_metrics_at_lightnings_steps_by_keyword(tmp_path):
    """As Lightning: "epoch" with the training rates, at the steps taken before the batch; the evaluations at
    their batch count over the fit; the loggers called with metrics= and step= keywords."""
    ours, theirs = _monitor_calls(False, tmp_path / "t"), _monitor_calls(True, tmp_path / "l")
    assert len(theirs) == 4 and all(set(c.kwargs) == {"metrics", "step"} and not c.args for c in theirs)
    assert ours == theirs


def test_a_stop_iteration_from_a_callback_hook_is_an_error_where_lightning_skips_the_validation(tmp_path):
    """Deliberate difference (docs/porting.md): Lightning's evaluation loop takes a StopIteration raised by a
    callback's on_validation_start for the end of the data and silently runs no validation (the fit then
    "succeeds"); Tandem lets it out, since it is a bug in the hook."""
    from callbacks import Callback
    from trainer.demos import BoringModel

    class Broken(Callback):
        def on_validation_start(self, trainer, task):
            raise StopIteration

    with pytest.raises(StopIteration):
        Trainer(
            max_steps=2, callbacks=[Broken()], **{**FAST, "limit_val_batches": 1, "val_check_interval": 1}
        ).fit(BoringModel())


def _logged(lightning: bool, tmp_path, fn: str, **options) -> list:
    """(keys, batches, step) of each log_metrics call of ThroughputMonitor in a run of `fn` (run twice for
    an evaluation), Lightning's or Tandem's."""
    from unittest import mock

    if lightning:
        pl = pytest.importorskip("pytorch_lightning")
        from pytorch_lightning.demos.boring_classes import BoringModel

        T, Monitor = pl.Trainer, pl.callbacks.ThroughputMonitor
    else:
        from trainer.demos import BoringModel

        T, Monitor = Trainer, ThroughputMonitor
    logger, model = mock.Mock(save_dir=str(tmp_path)), BoringModel()
    model.flops_per_batch = 10
    t = T(logger=logger, callbacks=Monitor(batch_size_fn=lambda x: 3, window_size=3, separator="|"),
          enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False, **options)  # fmt: skip
    for _ in range(1 if fn == "fit" else 2):
        getattr(t, fn)(model)
    out = []
    for c in logger.log_metrics.mock_calls:
        m = c.kwargs["metrics"]
        out.append((sorted(m), next(v for k, v in m.items() if k.endswith("|batches")), c.kwargs["step"]))
    return out


@pytest.mark.parametrize(
    ("fn", "options"),
    [("fit", dict(limit_train_batches=5, limit_val_batches=0, max_epochs=2, log_every_n_steps=3,
                  accumulate_grad_batches=2)),
     ("validate", dict(limit_val_batches=6, log_every_n_steps=3)),
     ("predict", dict(limit_predict_batches=4, log_every_n_steps=2))],
)  # fmt: skip
def test_monitor_logs_every_n_optimizer_steps_or_evaluation_batches_as_lightning(tmp_path, fn, options):
    ours, theirs = _logged(False, tmp_path / "t", fn, **options), _logged(True, tmp_path / "l", fn, **options)
    assert len(theirs) >= 2 and ours == theirs


# (device name as torch.cuda.get_device_name gives it, bf16 dense peak in TFLOP/s, float32 on tensor cores)
CHIPS = {
    "NVIDIA L4": (121, 60),
    "NVIDIA L40": (181.05, 90.5),
    "NVIDIA L40S": (362.05, 183),
    "NVIDIA A100-SXM4-80GB": (312, 156),
    "NVIDIA H100 80GB HBM3": (989.4, 494.7),
    "NVIDIA H100 PCIe": (756, 378),
    "NVIDIA H200": (989.4, 494.7),
}


@pytest.fixture
def gpu_named(monkeypatch):
    """Make get_available_flops see a CUDA device of a given name (compute capability 9.0)."""
    name = {"value": ""}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name["value"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def use(value: str) -> torch.device:
        name["value"] = value
        return torch.device("cuda", 0)

    return use


def test_the_chip_table_tells_the_gpus_apart_by_name(gpu_named):
    for chip, (bf16, tf32) in CHIPS.items():
        device = gpu_named(chip)
        assert get_available_flops(device, torch.bfloat16) == int(bf16 * 1e12), chip
        assert get_available_flops(device, torch.float16) == int(bf16 * 1e12), chip
        before = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("high")  # float32 matmuls on tensor cores (TF32)
            assert get_available_flops(device, torch.float32) == int(tf32 * 1e12), chip
        finally:
            torch.set_float32_matmul_precision(before)
    assert (
        len(
            {
                get_available_flops(gpu_named(c), torch.bfloat16)
                for c in ("NVIDIA L4", "NVIDIA L40", "NVIDIA L40S")
            }
        )
        == 3
    )
    assert get_available_flops(gpu_named("NVIDIA L4"), torch.float64) is None  # no float64 figure: no MFU
    assert get_available_flops(gpu_named("NVIDIA GeForce RTX 4090"), torch.bfloat16) is None  # not listed


def test_the_chip_table_agrees_with_lightnings_where_lightning_knows_the_chip(gpu_named):
    pytest.importorskip("pytorch_lightning")
    from lightning_fabric.utilities.throughput import get_available_flops as lightning_flops

    for chip in ("NVIDIA L4", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"):
        device = gpu_named(chip)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert get_available_flops(device, dtype) == lightning_flops(device, dtype), (chip, dtype)
    # where Lightning's lookup is wrong: an L40 or L40S is taken for an L4, an "NVIDIA H200" is not found
    with pytest.warns(UserWarning):
        assert lightning_flops(gpu_named("NVIDIA H200"), torch.bfloat16) is None
    for chip in ("NVIDIA L40", "NVIDIA L40S"):
        assert lightning_flops(gpu_named(chip), torch.bfloat16) == int(121e12)


PRECISION_DTYPES = {
    "32-true": torch.float32,
    "64-true": torch.float64,
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
    "bf16-true": torch.bfloat16,
    "16-true": torch.float16,
}


def test_mfu_uses_the_peak_of_the_dtype_each_precision_computes_in(monkeypatch):
    import callbacks.throughput.monitor as monitor

    asked: list[torch.dtype] = []
    monkeypatch.setattr(monitor, "get_available_flops", lambda device, dtype: asked.append(dtype) or 1000)
    for precision, dtype in PRECISION_DTYPES.items():
        cb = ThroughputMonitor(batch_size_fn=len)
        trainer = Trainer(precision=precision, callbacks=[cb], **FAST)
        cb.setup(trainer, Scored(), "fit")
        assert asked[-1] == dtype and cb.available_flops == 1000, precision
        assert trainer.precision.compute_dtype == dtype


def test_compute_dtypes_are_lightnings(monkeypatch):
    pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.callbacks.throughput_monitor import _plugin_to_compute_dtype
    from pytorch_lightning.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

    plugins = {
        "32-true": Precision(),
        "64-true": DoublePrecision(),
        "bf16-mixed": MixedPrecision("bf16-mixed", "cpu"),
        "bf16-true": HalfPrecision("bf16-true"),
        "16-true": HalfPrecision("16-true"),
    }
    with pytest.warns(UserWarning):  # (Lightning disables the fp16 scaler without CUDA)
        plugins["16-mixed"] = MixedPrecision("16-mixed", "cuda")
    for precision, plugin in plugins.items():
        assert _plugin_to_compute_dtype(plugin) == PRECISION_DTYPES[precision], precision
