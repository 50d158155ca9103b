"""DataParallelStrategy, one step at a time: CPU replicas in threads give the gradients of a single device on
the whole batch; scatter/gather, BatchNorm buffers, failures and backward threads behave like torch's DP."""

from __future__ import annotations

import threading
from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F
from conftest import QUIET
from helpers.dp import CPU, MLP, assert_same, grads_of, make_data
from torch.utils.data import DataLoader, TensorDataset

from strategies.data_parallel import DataParallelStrategy, ReplicaError, gather, scatter
from tandem_core.errors import ConfigError, TaskError
from trainer import Task, Trainer


# ----- scatter and gather -----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _strategies_torn_down(monkeypatch):
    """Tear down every DataParallelStrategy a test made, as a Trainer's stage does: the tests here call its
    steps directly, and replica threads left running end the test process with an abort at its exit."""
    made: list[DataParallelStrategy] = []
    init = DataParallelStrategy.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(DataParallelStrategy, "__init__", record)
    yield
    for strategy in made:
        strategy.teardown()


@pytest.mark.parametrize("n,replicas", [(7, 3), (2, 3), (4, 3), (8, 2), (1, 3), (10, 4)])
def test_scatter_splits_like_torch_chunk(n, replicas):
    Pair = namedtuple("Pair", "a b")
    batch = {
        "x": torch.arange(n * 2).view(n, 2),
        "pair": Pair(torch.arange(n), [torch.ones(n), "tag"]),
        "scale": torch.tensor(3.0),
        "names": "batch",
    }
    chunks, sizes = scatter(batch, [CPU] * replicas)
    expected = [len(c) for c in torch.arange(n).chunk(replicas)]
    assert sizes == expected and len(chunks) == len(expected)
    start = 0
    for chunk, size in zip(chunks, sizes):
        assert isinstance(chunk["pair"], Pair) and chunk["pair"].b[1] == "tag" and chunk["names"] == "batch"
        assert torch.equal(chunk["x"], batch["x"][start : start + size])
        assert torch.equal(chunk["pair"].b[0], torch.ones(size))
        assert chunk["scale"].item() == 3.0  # 0-dim tensors go to every replica
        start += size
    assert start == n


def test_scatter_rejects_tensors_of_different_lengths():
    with pytest.raises(TaskError, match=r"different lengths \[3, 8\]"):
        scatter((torch.zeros(8, 2), torch.zeros(3)), [CPU, CPU])


def test_gather_weights_scalars_by_chunk_size_and_concatenates_the_rest():
    out = gather(
        [
            {"loss": torch.tensor(1.0), "p": torch.zeros(3, 2), "k": 5},
            {"loss": torch.tensor(4.0), "p": torch.ones(1, 2), "k": 5},
        ],
        [3, 1],
        CPU,
    )
    assert out["loss"].item() == pytest.approx((3 * 1.0 + 1 * 4.0) / 4)
    assert out["p"].shape == (4, 2) and out["k"] == 5


# ----- gradients on one step ----------------------------------------------------------------------------
@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("n", [8, 7, 2, 1])
@pytest.mark.parametrize("batchnorm", [False, True])
def test_gradients_equal_single_device_on_the_full_batch(replicas, n, batchnorm):
    x, y = make_data(n).tensors
    reference, task = MLP(batchnorm), MLP(batchnorm)
    for t in (reference, task):
        t.train()
        t.on_train_epoch_start()
    F.cross_entropy(reference(x), y).backward()
    strategy = DataParallelStrategy(accelerator="cpu", devices=replicas)
    out = strategy.step(task, "training_step", (x, y), 0)
    out["loss"].backward()
    assert_same(grads_of(task), grads_of(reference))
    assert sorted(size for size, _ in task.seen) == sorted(len(c) for c in torch.arange(n).chunk(replicas))
    torch.testing.assert_close(out["logits"], reference(x).detach(), atol=1e-6, rtol=0)
    strategy.teardown()


def test_replicas_run_in_their_own_threads_and_replicate_every_step():
    task = MLP()
    strategy = DataParallelStrategy(accelerator="cpu", devices=3)
    x, y = make_data(9).tensors
    for _ in range(2):
        strategy.step(task, "training_step", (x, y), 0)["loss"].backward()
    threads = {name for _, name in task.seen}
    assert threading.current_thread().name in threads and len(threads) == 3
    assert strategy.stats["steps"] == 2 and strategy.stats["replicate_s"] > 0
    strategy.teardown()


def test_recurrent_modules_get_their_replica_weights():
    class Seq(Task):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lstm = torch.nn.LSTM(4, 5, batch_first=True)

        def training_step(self, batch, batch_idx):
            return self.lstm(batch)[0].pow(2).mean()

    x = torch.randn(5, 3, 4)
    reference, task = Seq(), Seq()
    reference.training_step(x, 0).backward()
    DataParallelStrategy(accelerator="cpu", devices=2).step(task, "training_step", x, 0).backward()
    assert_same(grads_of(task), grads_of(reference))


def test_batchnorm_statistics_come_from_replica_zero():
    bn, reference = torch.nn.BatchNorm1d(6), torch.nn.BatchNorm1d(6)

    class Norm(Task):
        def __init__(self):
            super().__init__()
            self.bn = bn

        def training_step(self, batch, batch_idx):
            return self.bn(batch).pow(2).mean()

    x = torch.randn(8, 6) * 3 + 1
    DataParallelStrategy(accelerator="cpu", devices=2).step(Norm().train(), "training_step", x, 0)
    reference.train()(x[:4])  # torch's DataParallel semantics: only replica 0's batch updates the buffers
    assert_same(dict(bn.named_buffers()), dict(reference.named_buffers()))


# ----- failures -------------------------------------------------------------------------------------------
class Failing(MLP):
    def training_step(self, batch, batch_idx):
        if (batch[0] == 999).any():
            raise ValueError("poisoned sample")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("where,index", [(0, 0), (7, 2)])
def test_an_exception_in_a_replica_names_the_replica(where, index):
    x, y = make_data(8).tensors
    x[where, 0] = 999
    strategy = DataParallelStrategy(accelerator="cpu", devices=3)
    with pytest.raises(ValueError, match=rf"dp replica {index} on cpu: ValueError: poisoned sample") as info:
        strategy.step(Failing(), "training_step", (x, y), 0)
    assert info.value.replica_index == index
    assert isinstance(info.value.__cause__, ValueError)  # the original, with the replica thread's traceback
    strategy.teardown()


def test_an_exception_that_cannot_be_renamed_becomes_replica_error():
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    class Raises(MLP):
        def training_step(self, batch, batch_idx):
            raise Odd(1, 2)

    x, y = make_data(4).tensors
    with pytest.raises(ReplicaError, match=r"replica 0 .*replicas \[1\] failed too"):
        DataParallelStrategy(accelerator="cpu", devices=2).step(Raises(), "training_step", (x, y), 0)


def test_a_failing_replica_fails_fit_and_manual_optimization_is_refused():
    x, y = make_data(8).tensors
    x[6, 0] = 999
    trainer = Trainer(strategy="dp", devices=2, accelerator="cpu", max_epochs=1, **QUIET)
    with pytest.raises(ValueError, match="dp replica 1"):
        trainer.fit(Failing(), DataLoader(TensorDataset(x, y), batch_size=8))

    class Manual(MLP):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

    with pytest.raises(ConfigError, match="automatic optimization"):
        DataParallelStrategy(accelerator="cpu", devices=2).step(Manual(), "training_step", (x, y), 0)


# ----- backward in the replicas' threads ------------------------------------------------------------------------
class _Probe(torch.autograd.Function):
    """Identity that records the thread its backward runs in (and fails there on request)."""

    threads: list[str] = []
    fail = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _Probe.threads.append(threading.current_thread().name)
        if _Probe.fail and threading.current_thread() is not threading.main_thread():
            raise RuntimeError("backward broke")
        return g


class Probed(MLP):
    def forward(self, x):
        return _Probe.apply(self.net(x))


def test_each_replica_runs_its_backward_in_its_own_thread():
    x, y = make_data(8).tensors
    reference, task = MLP(), Probed()
    F.cross_entropy(reference(x), y).backward()
    strategy = DataParallelStrategy(accelerator="cpu", devices=2)
    _Probe.threads.clear()
    strategy.backward(strategy.step(task, "training_step", (x, y), 0)["loss"])
    assert len(set(_Probe.threads)) == 2  # CPU autograd alone would run both on the calling thread
    assert_same(grads_of(task), grads_of(reference))
    assert strategy.stats["backward_s"] > 0
    _Probe.fail = True
    try:
        with pytest.raises(RuntimeError, match="dp replica 1 on cpu: RuntimeError: backward broke"):
            strategy.step(task, "training_step", (x, y), 0)["loss"].backward()
    finally:
        _Probe.fail = False
    strategy.teardown()


@pytest.mark.parametrize("outside", ["attribute", "list", "input"])
def test_gradients_reach_tensors_that_are_not_parameters(outside):
    class Scaled(MLP):
        def forward(self, x):
            return self.net(x) * self.temperature * self.scales[0]

    x, y = make_data(7).tensors
    results = []
    for replicas in (1, 3):
        task = Scaled()
        # a plain tensor attribute, a list of tensors, or the input needs grad: all outside the parameters
        task.temperature = torch.tensor(1.5, requires_grad=outside == "attribute")
        task.scales = [torch.tensor(0.5, requires_grad=outside == "list")]
        inputs = x.clone().requires_grad_(outside == "input")
        strategy = DataParallelStrategy(accelerator="cpu", devices=replicas)
        strategy.step(task, "training_step", (inputs, y), 0)["loss"].backward()
        grad = {"attribute": task.temperature, "list": task.scales[0], "input": inputs}[outside].grad
        results.append({**grads_of(task), "outside": grad})
    assert results[0]["outside"] is not None
    assert_same(results[1], results[0])


# ----- coalesced copies ---------------------------------------------------------------------------------
class _Copies:
    """Counts the copy kernels (copies, clones, concatenations) torch runs inside the block, by aten op."""

    OPS = ("_to_copy", "copy_", "clone", "cat")

    def __enter__(self):
        from collections import Counter

        from torch.utils._python_dispatch import TorchDispatchMode

        counts = self.counts = Counter()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name in _Copies.OPS:
                    counts[name] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Deep(Task):
    """20 Linear layers and a BatchNorm: 42 parameters and 3 buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            *(torch.nn.Linear(8, 8) for _ in range(20)), torch.nn.BatchNorm1d(8)
        )

    def forward(self, x):
        return self.layers(x)


def test_replicas_get_their_tensors_and_give_back_gradients_in_coalesced_copies(monkeypatch):
    """torch's DataParallel broadcasts and reduces coalesced; per-parameter copies would be 42 per replica
    (and 3 for the buffers) every step, each way."""
    import strategies.replicate as replicate
    from strategies.replicate import Replicas

    task, devices = Deep(), [CPU, CPU, CPU]
    params, buffers = list(task.parameters()), list(task.buffers())
    with _Copies() as forward:
        replicas = Replicas(task, devices, True, {})
    # one concatenation per dtype for the parameters (float32), one per dtype of the buffers (float32,
    # int64), then one copy of each for the third replica (the concatenation is the second's)
    assert forward.counts == {"cat": 3, "_to_copy": 3}, forward.counts
    sums: list = []
    original = replicate.sum_onto

    def counted(*args):
        with _Copies() as c:
            out = original(*args)
        sums.append(c.counts)
        return out

    monkeypatch.setattr(replicate, "sum_onto", counted)
    x = torch.randn(4, 8)
    loss = sum(m(x).square().sum() for m in replicas.modules)
    loss.backward()
    assert sums == [{"cat": 2}], sums  # each of the 2 copying replicas' 42 gradients in one pack, added
    # the gradients are those of three replicas of the task on the same input
    reference = Deep()
    reference.load_state_dict(task.state_dict())
    (3 * reference(x).square().sum()).backward()
    assert len(params) == 42 and len(buffers) == 3
    for p, q in zip(params, reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)
