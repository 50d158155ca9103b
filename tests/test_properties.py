"""Property tests: random Trainer arguments and random batch structures either work or raise a TandemError
with a message; never an internal traceback, never a hang."""

from __future__ import annotations

import collections
import dataclasses

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from strategies.batch import apply_to_tensors, batch_size_of, move_to_device
from tandem_core.errors import TandemError
from trainer import Task, Trainer
from trainer.options import NONE_IS_DEFAULT, OptionError, TrainerConfig

ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(
        ["auto", "cpu", "ddp", "dp", "single", "norm", "value", "warn", "16-mixed", "bf16", "32"]
    ),
    st.lists(st.integers(), max_size=2),
)
OPTIONS = [n for n in TrainerConfig.names() if n not in ("default_root_dir",)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kwargs=st.dictionaries(st.sampled_from(OPTIONS), ANY, max_size=4))
def test_random_trainer_arguments_work_or_raise_tandem_errors(kwargs, tmp_path_factory):
    kwargs = {**kwargs, "default_root_dir": str(tmp_path_factory.mktemp("run"))}
    try:
        Trainer(**kwargs)
    except TandemError as e:
        assert str(e).strip(), "a TandemError must say what to change"


@settings(max_examples=300, deadline=None)
@given(kwargs=st.dictionaries(st.sampled_from(TrainerConfig.names()), ANY, max_size=4))
def test_options_keep_what_they_accept_and_name_what_they_reject(kwargs):
    try:
        cfg = TrainerConfig.from_kwargs(**kwargs)
    except OptionError as e:
        assert e.option in kwargs and str(e).strip()
        return
    defaults = TrainerConfig.defaults()  # None means Lightning's default for these options, as in Lightning
    expected = {k: defaults[k] if v is None and k in NONE_IS_DEFAULT else v for k, v in kwargs.items()}
    assert {k: getattr(cfg, k) for k in kwargs} == expected


def _as_text(value: object) -> str:
    """How a YAML file, the command line or an environment variable would spell `value`."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(TrainerConfig.names()), value=ANY)
def test_an_accepted_number_or_flag_reads_back_from_its_text(name, value):
    """Coercion by type: the text of every valid bool/int/float value of an option gives that value."""
    if not isinstance(value, (bool, int, float)):
        return
    try:
        TrainerConfig.from_kwargs(**{name: value})
    except OptionError:
        return
    back = TrainerConfig.coerce({name: _as_text(value)})[name]
    assert back == value and isinstance(back, bool) == isinstance(value, bool), (name, value, back)
    TrainerConfig.from_kwargs(**{name: back})


class _Echo(Task):
    """training_step returns whatever the test gives it."""

    def __init__(self, out):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.out = out

    def training_step(self, batch, batch_idx):
        return self.out(self) if callable(self.out) else self.out

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


OUTPUTS = st.one_of(
    ANY.filter(lambda v: v is not None),  # None is Lightning's "skip this batch": tested in test_loop.py
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from(
        [
            torch.zeros(3),
            torch.zeros(2, 2),
            torch.tensor(1.0),
            {"loss": torch.zeros(2)},
            {"los": torch.tensor(1.0)},
        ]
    ),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(out=OUTPUTS)
def test_bad_training_step_outputs_raise_tandem_errors(out, tmp_path):
    trainer = Trainer(
        max_steps=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    try:
        trainer.fit(_Echo(out), data)
    except TandemError as e:
        assert str(e).strip()
    else:
        raise AssertionError(f"training_step returning {out!r} was accepted")


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Box:
    x: object
    y: object


LEAVES = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.text(max_size=3),
    st.none(),
    st.floats(allow_nan=False),
    st.builds(
        lambda n, d: torch.randn(n, 2).to(d),
        st.integers(0, 3),
        st.sampled_from([torch.float32, torch.float64]),
    ),
    st.builds(lambda n: torch.randint(0, 5, (n,)), st.integers(0, 3)),
    st.just(torch.tensor(3.0)),
)
BATCHES = st.recursive(
    LEAVES,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=3), kids, max_size=3),
        st.builds(Pair, kids, kids),
        st.builds(Box, kids, kids),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(BATCHES)
def test_any_batch_structure_moves_and_keeps_its_shape(batch):
    moved = move_to_device(batch, torch.device("cpu"), torch.float64)
    assert type(moved) is type(batch)
    seen: list[torch.Tensor] = []
    apply_to_tensors(moved, seen.append)
    assert all(t.dtype != torch.float32 for t in seen)  # floats became float64, others kept their dtype
    assert batch_size_of(batch) >= 0
