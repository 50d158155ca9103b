"""Activation checkpointing (strategies/large/activation.py): full and selective against none, in float64 (the
gradients equal within 1e-12), through FSDPStrategy(activation_checkpointing_policy=...) as through
checkpoint_modules; the peak of a step's allocations lower on long sequences; and its clear errors. FSDP at 2
ranks: tests/test_large_models.py."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.fsdp import FSDPStrategy
from strategies.large.activation import checkpoint_modules
from strategies.memory.tracker import LiveBytes
from tandem_core.errors import ConfigError
from tests.conftest import FAST
from trainer import Task, Trainer

SAVE = ["aten.mm", "aten.addmm"]  # selective: keep the matrix products, recompute the rest


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.qkv, self.o = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n2, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.n2(x))))


class LM(Task):
    def __init__(self, d: int = 32, heads: int = 4, layers: int = 3, vocab: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _tokens(n: int, t: int, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (n, t), generator=g)
    return x, torch.roll(x, -1, dims=1)


def _grads(model: LM, x, y) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model.training_step((x, y), 0).backward()
    return {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone() for n, p in model.named_parameters()}


def test_full_and_selective_checkpointing_give_the_same_gradients_float64():
    torch.manual_seed(0)
    plain = LM().double()
    full, selective = copy.deepcopy(plain), copy.deepcopy(plain)
    assert checkpoint_modules(full, {Block}) == ["blocks.0", "blocks.1", "blocks.2"]
    assert checkpoint_modules(selective, {"Block"}, save_ops=SAVE) == ["blocks.0", "blocks.1", "blocks.2"]
    assert full.state_dict().keys() == plain.state_dict().keys()  # the names a checkpoint holds stay
    x, y = _tokens(4, 16)
    want = _grads(plain, x, y)
    for model in (full, selective):
        got = _grads(model, x, y)
        assert got.keys() == want.keys()
        assert max((got[k] - want[k]).abs().max().item() for k in want) <= 1e-12


def _peak(model: LM, x, y) -> int:
    with LiveBytes() as live:  # every storage a step allocates, until freed (benchmarks/activation_memory.py
        model.training_step((x, y), 0).backward()  # measures the same from the allocator's own records)
    model.zero_grad(set_to_none=True)
    return live.peak


def test_checkpointing_lowers_the_peak_of_a_step_on_long_sequences():
    torch.manual_seed(0)
    plain = LM(d=32, heads=4, layers=3)
    full, selective = copy.deepcopy(plain), copy.deepcopy(plain)
    checkpoint_modules(full, {Block})
    checkpoint_modules(selective, {Block}, save_ops=SAVE)
    x, y = _tokens(2, 256)
    none_b, full_b, sel_b = (_peak(m, x, y) for m in (plain, full, selective))
    # the attention scores and probabilities (2 x 4 x 256 x 256 floats, 2 MB each a block) are what full
    # checkpointing drops
    assert full_b < 0.6 * none_b, (none_b, full_b)
    assert full_b < sel_b < none_b, (none_b, sel_b, full_b)


def test_fsdp_policy_option_trains_as_without_it():
    data = DataLoader(TensorDataset(*_tokens(16, 12)), batch_size=4)

    def run(**kwargs):
        torch.manual_seed(0)
        task = LM().double()
        t = Trainer(strategy=FSDPStrategy(**kwargs), devices=1, max_steps=2, precision="64-true", **FAST)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.fit(task, data)
        return task.state_dict()

    want = run()
    for kwargs in ({"activation_checkpointing_policy": {Block}},
                   {"activation_checkpointing_policy": {Block}, "activation_checkpointing_save_ops": SAVE}):  # fmt: skip
        got = run(**kwargs)
        assert max((got[k] - want[k]).abs().max().item() for k in want) <= 1e-12


def test_clear_errors():
    with pytest.raises(ConfigError, match="give that policy too"):
        FSDPStrategy(activation_checkpointing_save_ops=["aten.mm"])
    with pytest.raises(ConfigError, match="no op 'aten.nosuchop'"):
        FSDPStrategy(
            activation_checkpointing_policy={Block}, activation_checkpointing_save_ops=["aten.nosuchop"]
        )
    with pytest.raises(ConfigError, match="not a module class of the task"):
        checkpoint_modules(LM(), {"Nothing"})
    model = LM()
    checkpoint_modules(model, {Block})
    with pytest.raises(ConfigError, match="apply it once"):
        checkpoint_modules(model, {Block})
