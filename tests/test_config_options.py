"""trainer/options.py: the one definition of the Trainer's options gives its signature, docstring, checks,
effective values and the typing of text values."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
from conftest import FAST

from tandem_core.errors import ConfigError
from trainer import Trainer
from trainer.options import NONE_IS_DEFAULT, OptionError, TrainerConfig


def test_unknown_keyword_names_the_closest_option():
    with pytest.raises(ConfigError, match=r"unknown Trainer option 'max_epoch', did you mean 'max_epochs'\?"):
        Trainer(max_epoch=3, **FAST)
    with pytest.raises(OptionError, match=r"did you mean 'gradient_clip_val'\?") as info:
        TrainerConfig.from_kwargs(gradient_clip=1.0)
    assert (info.value.option, info.value.unknown) == ("gradient_clip", True)
    with pytest.raises(ConfigError, match=r"unknown Trainer option 'zzz' \(every option"):
        TrainerConfig.from_kwargs(zzz=1)  # nothing close: no suggestion


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, -1.0, -1, True, "1.0", [1.0]])
def test_gradient_clip_val_must_be_a_finite_number_at_least_zero(value):
    with pytest.raises(ConfigError, match=r"gradient_clip_val must be a number >= 0 \(finite\) or None"):
        Trainer(gradient_clip_val=value, **FAST)


@pytest.mark.parametrize("value", [None, 0, 0.0, 0.5, 3, 1e30])
def test_gradient_clip_val_accepts_finite_numbers_and_none(value):
    assert Trainer(gradient_clip_val=value, **FAST).config.gradient_clip_val == value


def test_trainer_signature_and_docstring_come_from_the_options():
    params = inspect.signature(Trainer).parameters
    assert list(params) == TrainerConfig.names()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    # the defaults, None where None means the default (Lightning's signature; a LightningCLI config then sets none)
    none = {n: None for n in NONE_IS_DEFAULT}
    assert {n: p.default for n, p in params.items()} == {**TrainerConfig.defaults(), **none}
    assert TrainerConfig(**{n: p.default for n, p in params.items()}) == TrainerConfig()
    fields = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    # the annotations as types (LightningCLI's jsonargparse reads them), resolved from the options' text
    import datetime
    import typing

    from callbacks import Callback
    from strategies import Strategy
    from strategies.plugins import plugin_type
    from trainer.loggers import Logger
    from trainer.profiler import Profiler

    names = {"Strategy": Strategy, "Logger": Logger, "Callback": Callback, "timedelta": datetime.timedelta}
    names["Profiler"] = Profiler
    names["Plugin"] = plugin_type()  # the plugin kinds (a LightningCLI config builds one by class_path)
    hints = typing.get_type_hints(TrainerConfig, localns=names)
    assert all(p.annotation == hints[n] for n, p in params.items())
    assert {n: f.type for n, f in fields.items()}["strategy"] == "str | Strategy"  # the text the docs show
    doc = inspect.getdoc(Trainer.__init__)
    for name, f in fields.items():
        assert f"- `{name}` ({f.type}) = `{f.default!r}`: {f.metadata['doc']}" in doc
    bound = inspect.signature(Trainer).bind(max_steps=3)  # what tools that read signatures see
    assert bound.arguments == {"max_steps": 3}
    with pytest.raises(TypeError):
        inspect.signature(Trainer).bind(3)


def test_every_option_has_a_check_that_names_it():
    for name in TrainerConfig.names():
        with pytest.raises(OptionError) as info:
            TrainerConfig.from_kwargs(**{name: object()})
        e = info.value
        assert e.option == name and not e.unknown
        # plugins: an option kept for Lightning's signature that takes no value at all
        assert str(e).startswith((f"{name} must be", f"unknown {name} ", f"{name} are not supported")), str(e)
        assert e.problem.startswith(("must be", f"unknown {name} ", "are not supported")), e.problem


def _by_hand(fast_dev_run: bool | int, max_epochs: int | None, max_steps: int) -> dict[str, object]:
    """The values Lightning's fast_dev_run and max_epochs defaults give, written out."""
    if fast_dev_run:
        n = 1 if fast_dev_run is True else fast_dev_run
        return dict(
            max_epochs=1,
            max_steps=n,
            num_sanity_val_steps=0,
            limit_train_batches=n,
            limit_val_batches=n,
            limit_test_batches=n,
            limit_predict_batches=n,
            val_check_interval=1.0,
            logger=False,
            enable_checkpointing=False,
        )
    if max_epochs is None:
        return dict(max_epochs=1000 if max_steps == -1 else -1, max_steps=max_steps)
    return dict(max_epochs=max_epochs, max_steps=max_steps)


@pytest.mark.parametrize("fast_dev_run", [False, True, 0, 4])
@pytest.mark.parametrize(("max_epochs", "max_steps"), [(None, -1), (None, 7), (5, -1), (-1, 7)])
def test_effective_values(fast_dev_run, max_epochs, max_steps):
    given = dict(fast_dev_run=fast_dev_run, max_epochs=max_epochs, max_steps=max_steps, limit_val_batches=0.5)
    cfg = TrainerConfig.from_kwargs(**given)
    eff = cfg.effective()
    expected = {**TrainerConfig.defaults(), **given, **_by_hand(fast_dev_run, max_epochs, max_steps)}
    assert dataclasses.asdict(eff) == expected
    assert eff.effective() == eff  # applying it again changes nothing
    assert (cfg.max_epochs, cfg.max_steps) == (max_epochs, max_steps)  # the given config is kept as given
    trainer = Trainer(**{**FAST, **given})
    assert trainer.config == TrainerConfig.from_kwargs(**{**FAST, **given}).effective()


def test_coerce_reads_text_as_the_option_type():
    text = {
        "max_epochs": "3",
        "limit_train_batches": "0.5",
        "limit_val_batches": "2",
        "devices": "auto",
        "num_nodes": " 2 ",
        "enable_progress_bar": "FALSE",
        "fast_dev_run": "true",
        "gradient_clip_val": "1",
        "max_time": "00:00:01:00",
        "precision": "bf16-mixed",
        "default_root_dir": "007",
        "accelerator": "1",
        "max_steps": "ten",
        "not_an_option": "3",
    }
    expected = {
        "max_epochs": 3,
        "limit_train_batches": 0.5,
        "limit_val_batches": 2,
        "devices": "auto",
        "num_nodes": 2,
        "enable_progress_bar": False,
        "fast_dev_run": True,
        "gradient_clip_val": 1.0,
        "max_time": "00:00:01:00",
        "precision": "bf16-mixed",
        "default_root_dir": "007",  # str options keep text
        "accelerator": "1",
        "max_steps": "ten",  # not an int: left for the check to report
        "not_an_option": "3",  # left for check_names to report
    }
    coerced = TrainerConfig.coerce(text)
    assert coerced == expected
    assert {k: type(v) for k, v in coerced.items()} == {k: type(v) for k, v in expected.items()}
    assert TrainerConfig.coerce({"max_epochs": 3, "logger": True}) == {"max_epochs": 3, "logger": True}
