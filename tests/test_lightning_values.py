"""Every value Lightning 2.6 accepts for a Trainer option: Tandem resolves it as Lightning does, or refuses it
by name. Lightning itself (pytorch_lightning 2.6.6) parses the same values for comparison."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from tandem_core.errors import ConfigError
from trainer import Trainer
from trainer.options import NONE_IS_DEFAULT, TrainerConfig
from trainer.porting import LIGHTNING_STRATEGIES, LIGHTNING_VALUES

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(enable_progress_bar=False, enable_model_summary=False)


def lightning_trainer(tmp_path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pl.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), **kw)


def test_every_lightning_option_is_listed_and_known():
    lightning = [p for p in inspect.signature(pl.Trainer.__init__).parameters if p != "self"]
    assert sorted(LIGHTNING_VALUES) == sorted(lightning)
    assert set(lightning) <= set(TrainerConfig.names())


def test_none_means_lightnings_default(tmp_path):
    nones = {name: None for name in NONE_IS_DEFAULT}
    ours = Trainer(accelerator="cpu", default_root_dir=str(tmp_path), gradient_clip_algorithm=None, **nones)
    theirs = lightning_trainer(tmp_path, gradient_clip_algorithm=None, **nones)
    cfg = ours.config
    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                 "val_check_interval", "num_sanity_val_steps", "log_every_n_steps"):  # fmt: skip
        assert getattr(cfg, name) == getattr(theirs, name), name
    assert ours.precision == theirs.precision == "32-true"
    assert (ours.checkpoint_callback is None) == (theirs.checkpoint_callback is None) is False
    assert (ours.progress_bar_callback is None) == (theirs.progress_bar_callback is None) is False
    assert type(ours.logger).__name__ == type(theirs.logger).__name__ == "TensorBoardLogger"
    assert cfg.gradient_clip_algorithm is theirs.gradient_clip_algorithm is None  # both clip by norm then
    # the default logger's folder is Lightning's
    assert ours.logger.root_dir == theirs.logger.root_dir == str(tmp_path / "lightning_logs")


SPELLINGS = LIGHTNING_VALUES["precision"][1:]


@pytest.mark.parametrize("precision", SPELLINGS, ids=repr)
def test_precision_spellings_resolve_as_lightnings(precision, tmp_path):
    try:
        theirs = str(lightning_trainer(tmp_path, precision=precision, logger=False).precision)
    except (ImportError, ModuleNotFoundError, ValueError) as e:  # transformer-engine needs its package
        theirs = type(e).__name__
    try:
        ours = Trainer(precision=precision, accelerator="cpu", logger=False, **QUIET).precision.name
    except ConfigError as e:
        assert "transformer-engine" in str(precision) and "not supported by Tandem" in str(e)
        assert theirs in ("ModuleNotFoundError", "ImportError")
        return
    if ours == "16-mixed" and theirs == "bf16-mixed":  # Lightning swaps fp16 AMP for bf16 on the CPU; Tandem
        return  # runs torch's fp16 autocast there, with the scaler (docs/porting.md, Differences)
    assert ours == theirs


def test_every_registry_strategy_is_an_alias_with_lightnings_arguments_or_a_refusal():
    from pytorch_lightning.strategies import StrategyRegistry

    from strategies import REFUSED, STRATEGIES, _load

    assert sorted(StrategyRegistry) == sorted(LIGHTNING_STRATEGIES)
    for name, entry in StrategyRegistry.items():
        if name in REFUSED:
            with pytest.raises(ConfigError, match=f"strategy={name!r}: .*(use|with) strategy="):
                Trainer(strategy=name, accelerator="cpu", logger=False)
            if name.startswith("deepspeed"):
                assert "strategy='fsdp'" in REFUSED[name]  # the nearest Tandem strategy
            continue
        assert name in STRATEGIES, name
        cls, kwargs = _load(name)
        assert cls.__name__ == entry["strategy"].__name__, name
        theirs = {k: v for k, v in entry["init_params"].items() if k != "start_method" or v != "popen"}
        ours = {k: v for k, v in kwargs.items() if k != "start_method" or v != "popen"}  # popen: the default
        assert ours == theirs, name
        built = cls(**kwargs)  # ddp_spawn too: its workers start from this process (tests/test_spawn.py)
        for k, v in kwargs.items():
            assert getattr(built, k) == v, (name, k)


def test_single_device_is_single():
    t = Trainer(strategy="single_device", accelerator="cpu", logger=False)
    assert type(t.strategy).__name__ == "SingleDeviceStrategy"
    with pytest.raises(ConfigError, match="strategy='single_device' runs on one device but devices=2"):
        Trainer(strategy="single_device", devices=2, accelerator="cpu", logger=False)


def test_lightnings_other_names_are_refused_by_name():
    with pytest.raises(ConfigError, match="accelerator 'tpu' is not supported by Tandem"):
        Trainer(accelerator="tpu")
    with pytest.raises(ConfigError, match="profiler='xla'"):
        Trainer(profiler="xla")
    with pytest.raises(ConfigError, match="model_registry must be None: Tandem has no model registry"):
        Trainer(model_registry="my-model")


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.5


@pytest.mark.parametrize("precision,dtype", [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_true_half_precision_equals_a_hand_loop_in_that_dtype(precision, dtype):
    from trainer import Task

    x, y = _data()
    made = []

    class Half(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = Regressor().net

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            made.append(torch.zeros(1).dtype)  # a tensor made in the step: the default dtype is the run's
            return torch.nn.functional.mse_loss(self.net(xb), yb)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    task = Half()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    Trainer(max_epochs=2, precision=precision, accelerator="cpu", logger=False, enable_checkpointing=False,
            num_sanity_val_steps=0, **QUIET).fit(task, loader)  # fmt: skip
    assert set(made) == {dtype} and torch.get_default_dtype() == torch.float32

    hand = Regressor().net.to(dtype)  # Lightning's HalfPrecision: the module and float inputs in the dtype
    opt = torch.optim.SGD(hand.parameters(), lr=0.05)
    for _ in range(2):
        for i in range(0, 48, 8):
            loss = torch.nn.functional.mse_loss(hand(x[i : i + 8].to(dtype)), y[i : i + 8].to(dtype))
            opt.zero_grad()
            loss.backward()
            opt.step()
    for (name, p), q in zip(task.net.named_parameters(), hand.parameters()):
        assert p.dtype == dtype, name
        assert torch.equal(p, q), name


@pytest.mark.parametrize("name", ["limit_train_batches", "limit_val_batches", "limit_test_batches",
                                  "limit_predict_batches", "overfit_batches", "val_check_interval"])  # fmt: skip
def test_batch_counts_and_fractions_read_as_lightnings(name, tmp_path):
    for value in LIGHTNING_VALUES[name]:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue  # durations: tests/test_val_check_time.py
        theirs = getattr(lightning_trainer(tmp_path, **{name: value}, logger=False), name)
        ours = getattr(TrainerConfig.from_kwargs(**{name: value}), name)
        assert ours == theirs and type(ours) is type(theirs), (name, value, ours, theirs)


def test_any_iterable_of_loggers_as_lightning(tmp_path):
    from trainer.loggers import CSVLogger

    t = Trainer(logger=(CSVLogger(str(tmp_path), name=n) for n in "ab"), accelerator="cpu", **QUIET)
    assert [lg.name for lg in t.loggers] == ["a", "b"]
