"""DataParallelStrategy: CPU replicas in threads give the gradients, weights, logged values and predictions
of a single-device run on the whole batch; uneven batches, failures and buffers behave like torch's DP."""

from __future__ import annotations

import threading
from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from strategies import resolve_strategy
from strategies.data_parallel import DataParallelStrategy, ReplicaError, gather, scatter
from trainer import Task, Trainer
from trainer.errors import ConfigError, TaskError

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
CPU = torch.device("cpu")


def make_data(n: int = 50, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


class MLP(Task):
    """An MLP with (disabled) dropout and, optionally, a BatchNorm kept in eval mode."""

    def __init__(self, batchnorm: bool = False, lr: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(1)
        layers = [torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.0)]
        if batchnorm:
            layers.insert(1, torch.nn.BatchNorm1d(16))
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(16, 3))
        self.batchnorm, self.lr = batchnorm, lr
        self.seen: list[tuple[int, str]] = []  # (chunk size, thread name) of every training_step call
        if batchnorm:  # non-trivial running statistics, so that eval-mode BatchNorm matters
            self.net[1].running_mean.uniform_(-0.5, 0.5)
            self.net[1].running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_epoch_start(self) -> None:
        if self.batchnorm:
            self.net[1].eval()

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((len(x), threading.current_thread().name))
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        self.log("train/n", float(len(x)), reduce_fx="sum", on_step=False, on_epoch=True)
        self.log("train/max_x", x.max(), reduce_fx="max", on_epoch=True)
        return {"loss": loss, "logits": self(x).detach()}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.log("val/acc", (logits.argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).softmax(-1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def grads_of(task: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in task.named_parameters()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


# ----- scatter and gather -----------------------------------------------------------------------------
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
    out = strategy.training_step(task, (x, y), 0)
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
        strategy.training_step(task, (x, y), 0)["loss"].backward()
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
    DataParallelStrategy(accelerator="cpu", devices=2).training_step(task, x, 0).backward()
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
    DataParallelStrategy(accelerator="cpu", devices=2).training_step(Norm().train(), x, 0)
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
        strategy.training_step(Failing(), (x, y), 0)
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
        DataParallelStrategy(accelerator="cpu", devices=2).training_step(Raises(), (x, y), 0)


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
        DataParallelStrategy(accelerator="cpu", devices=2).training_step(Manual(), (x, y), 0)


# ----- through the Trainer: same weights, logs, validation, prediction --------------------------------------
def fit(strategy: str, devices: int = 1, accumulate: int = 1, batchnorm: bool = False, **kwargs):
    task = MLP(batchnorm)
    calls: list[str] = []
    trainer = Trainer(
        strategy=strategy,
        devices=devices,
        accelerator="cpu",
        max_epochs=2,
        accumulate_grad_batches=accumulate,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        **QUIET,
    )
    real_log = trainer._metrics.log

    def counting(name, value, **kw):  # every self.log that reaches the metric store
        calls.append(name)
        return real_log(name, value, **kw)

    trainer._metrics.log = counting
    trainer.fit(task, DataLoader(make_data(), batch_size=7), DataLoader(make_data(20, seed=1), batch_size=6))
    return task, trainer, calls


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("accumulate,batchnorm", [(1, False), (1, True), (3, False), (3, True)])
def test_fit_equals_single_device(replicas, accumulate, batchnorm):
    reference, ref_trainer, ref_calls = fit("single", accumulate=accumulate, batchnorm=batchnorm)
    task, trainer, calls = fit("dp", replicas, accumulate=accumulate, batchnorm=batchnorm)
    assert_same(task.state_dict(), reference.state_dict())
    assert trainer.global_step == ref_trainer.global_step
    # 50 samples in batches of 7 (the last one of 1 sample) over `replicas` chunks, two epochs
    assert len(task.seen) == 2 * (7 * len(torch.arange(7).chunk(replicas)) + 1)
    # logged once per step, not once per replica, with the full-batch values
    assert calls == ref_calls
    assert trainer.callback_metrics.keys() == ref_trainer.callback_metrics.keys()
    for k, v in ref_trainer.callback_metrics.items():
        torch.testing.assert_close(trainer.callback_metrics[k], v, atol=1e-6, rtol=0, msg=k)
    assert trainer.callback_metrics["train/n"].item() == 50  # reduce_fx="sum" over replicas and batches


def test_validate_and_predict_through_dp():
    reference, task = MLP(), MLP()
    loader = DataLoader(make_data(23, seed=2), batch_size=8)
    single = Trainer(strategy="single", accelerator="cpu", **QUIET)
    dp = Trainer(strategy="dp", devices=3, accelerator="cpu", **QUIET)
    expected, got = single.validate(reference, loader), dp.validate(task, loader)
    assert expected[0].keys() == got[0].keys()
    for k in expected[0]:
        assert got[0][k] == pytest.approx(expected[0][k], abs=1e-6)
    preds, ref_preds = dp.predict(task, loader), single.predict(reference, loader)
    assert [p.shape[0] for p in preds] == [8, 8, 7]
    torch.testing.assert_close(torch.cat(preds), torch.cat(ref_preds), atol=1e-6, rtol=0)
    assert not torch.cat(preds).requires_grad


def test_torchmetrics_metrics_are_merged_over_replicas():
    from torchmetrics.classification import MulticlassAccuracy

    class WithMetric(MLP):
        def __init__(self):
            super().__init__()
            self.acc = MulticlassAccuracy(num_classes=3, average="macro")

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.acc(self(x), y)
            self.log("val/acc", self.acc, on_step=True, on_epoch=True)
            self.log("val/step_acc", self.acc._forward_cache, on_step=True, on_epoch=False)

        def on_validation_epoch_end(self):
            self.updates = self.acc._update_count

    loader = DataLoader(make_data(41, seed=3), batch_size=9)
    results = {}
    for strategy, devices in (("single", 1), ("dp", 3)):
        trainer = Trainer(strategy=strategy, devices=devices, accelerator="cpu", **QUIET)
        task = WithMetric()
        out = trainer.validate(task, loader)[0]
        results[strategy] = (out, float(trainer.callback_metrics["val/acc_step"]), task.updates)
    (ref, ref_step, ref_count), (got, step, count) = results["single"], results["dp"]
    assert got["val/acc_epoch"] == pytest.approx(
        ref["val/acc_epoch"], abs=1e-6
    )  # macro: not a mean of chunks
    assert step == pytest.approx(ref_step, abs=1e-6)  # the last batch's value over all its replicas
    assert count == ref_count == 5  # one update per batch


def test_replicas_follow_grad_mode_autocast_and_device():
    seen = []

    class Probe(MLP):
        def training_step(self, batch, batch_idx):
            seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), self.device))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), self.device))

    trainer = Trainer(
        strategy="dp", devices=2, accelerator="cpu", precision="bf16-mixed", max_steps=1, **QUIET
    )
    data = DataLoader(make_data(8), batch_size=8)
    trainer.fit(Probe(), data, data)
    # sanity-check validation (no grad), one training step, validation at the end of the epoch
    assert seen == [(False, True, CPU)] * 2 + [(True, True, CPU)] * 2 + [(False, True, CPU)] * 2


def test_config_names_and_devices():
    s = resolve_strategy("dp", "cpu", 3, "32-true")
    assert isinstance(s, DataParallelStrategy) and s.devices == [CPU] * 3 and s.world_size == 1
    with pytest.raises(ConfigError, match="devices >= 1"):
        DataParallelStrategy(accelerator="cpu", devices=0)
    if torch.cuda.device_count() < 8:
        with pytest.raises(ConfigError):
            DataParallelStrategy(accelerator="cuda", devices=8)


# ----- switching strategies changes nothing else -------------------------------------------------------------
def _fit_ddp(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    task = MLP()
    trainer = Trainer(strategy="ddp", devices=world_size, accelerator="cpu", max_epochs=2, **QUIET)
    trainer.fit(task, DataLoader(make_data(48), batch_size=4))  # 4 per rank: the global batch is 8
    return task.state_dict()


def test_single_dp_and_ddp_give_the_same_weights(dist_run):
    weights = {}
    for strategy, devices in (("single", 1), ("dp", 2)):
        task = MLP()
        Trainer(strategy=strategy, devices=devices, accelerator="cpu", max_epochs=2, **QUIET).fit(
            task, DataLoader(make_data(48), batch_size=8)
        )
        weights[strategy] = task.state_dict()
    assert_same(weights["dp"], weights["single"])
    for state in dist_run(_fit_ddp):
        assert_same(state, weights["single"], atol=1e-5)


# ----- the reference on GPUs ------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_equals_torch_data_parallel_on_cuda():
    x, y = (t.cuda() for t in make_data(13).tensors)
    reference, task = MLP().cuda(), MLP().cuda()
    F.cross_entropy(torch.nn.DataParallel(reference.net, device_ids=[0, 1])(x), y).backward()
    strategy = DataParallelStrategy(accelerator="cuda", devices=2)
    strategy.setup(task)
    strategy.training_step(task, (x, y), 0)["loss"].backward()
    assert_same(grads_of(task), grads_of(reference), atol=1e-5)
    assert task.net[0].weight.grad.device == torch.device("cuda", 0)


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
    strategy.backward(strategy.training_step(task, (x, y), 0)["loss"])
    assert len(set(_Probe.threads)) == 2  # CPU autograd alone would run both on the calling thread
    assert_same(grads_of(task), grads_of(reference))
    assert strategy.stats["backward_s"] > 0
    _Probe.fail = True
    try:
        with pytest.raises(RuntimeError, match="dp replica 1 on cpu: RuntimeError: backward broke"):
            strategy.training_step(task, (x, y), 0)["loss"].backward()
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
        strategy.training_step(task, (inputs, y), 0)["loss"].backward()
        grad = {"attribute": task.temperature, "list": task.scales[0], "input": inputs}[outside].grad
        results.append({**grads_of(task), "outside": grad})
    assert results[0]["outside"] is not None
    assert_same(results[1], results[0])


def test_deterministic_runs_replicas_in_order_so_dropout_reproduces():
    class Dropping(MLP):
        def __init__(self):
            super().__init__()
            self.net[2].p = 0.5

    def run() -> tuple[dict[str, torch.Tensor], set[str]]:
        task = Dropping()
        trainer = Trainer(
            strategy="dp", devices=3, accelerator="cpu", max_epochs=1, deterministic=True, **QUIET
        )
        trainer.fit(task, DataLoader(make_data(), batch_size=9))
        return task.state_dict(), {name for _, name in task.seen}

    try:
        (first, threads), (second, _) = run(), run()
    finally:
        torch.use_deterministic_algorithms(False)
    assert threads == {threading.current_thread().name}  # the replicas ran one after another
    for k in first:
        assert torch.equal(first[k], second[k]), k
