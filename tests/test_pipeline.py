"""PipelineStrategy through the Trainer: GPipe, 1F1B and Interleaved1F1B at 2 and 4 pipeline ranks against one
process on the same batches (weights and every step's loss on every rank), pipeline x FSDP on a (2, 2) mesh,
a checkpoint resumed, the batch-size checks before any step, and the options' errors (precision, evaluation and
clipping: tests/test_pipeline_complete.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import resolve_strategy
from strategies.pipeline import PipelineStrategy
from tandem_core.errors import ConfigError, TaskError
from tests.conftest import FAST, run_distributed
from trainer import Task, Trainer

BLOCKS, WIDTH, BATCH = 8, 16, 12  # 48 samples: 4 steps of 12 per epoch


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class PipeNet(Task):
    """An input layer, BLOCKS residual blocks and a head; configure_pipeline cuts the blocks evenly."""

    def __init__(self, n_stages: int = 2, opt: str = "adam") -> None:
        super().__init__()
        torch.manual_seed(2)
        self.inp = torch.nn.Linear(6, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(WIDTH, 3)
        self.n_stages, self.opt = n_stages, opt

    def forward(self, x):
        for m in (self.inp, *self.blocks, self.head):
            x = m(x)
        return x

    def configure_pipeline(self):
        per = BLOCKS // self.n_stages
        stages = [torch.nn.Sequential(*self.blocks[i * per : (i + 1) * per]) for i in range(self.n_stages)]
        stages[0].insert(0, self.inp)
        stages[-1].append(self.head)
        return stages

    def pipeline_loss(self, output, target):
        return F.cross_entropy(output, target)

    def validation_step(self, batch, batch_idx):  # (through the stages: the whole model's forward)
        self.eval_outputs.append(self(batch[0]).detach().clone())

    def test_step(self, batch, batch_idx):
        self.eval_outputs.append(self(batch[0]).detach().clone())

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def training_step(self, batch, batch_idx):  # one process (the reference) only
        x, y = batch
        return self.pipeline_loss(self(x), y)

    def configure_optimizers(self):
        if self.opt == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def data(n: int = 48, dtype=torch.float64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=g).to(dtype), torch.randint(0, 3, (n,), generator=g))


def _fit(
    strategy, devices, n_stages, precision="64-true", opt="adam", epochs=1, ckpt=None, batch=BATCH, n=48, **kw
):
    task, losses = PipeNet(n_stages, opt), Losses()
    trainer = Trainer(
        strategy=strategy,
        devices=devices,
        max_epochs=epochs,
        precision=precision,
        callbacks=[losses],
        **FAST,
        **kw,
    )
    dtype = torch.float64 if precision == "64-true" else torch.float32
    trainer.fit(task, DataLoader(data(n, dtype), batch_size=batch), ckpt_path=ckpt)
    own = {k: v.detach().clone() for k, v in task.state_dict().items() if not v.is_meta}
    return trainer, own, losses.losses


def _full(own: dict) -> dict:
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in own.items()}


def _pipeline_fsdp(world: int) -> dict:
    """pp=2 x dp=2 on one Trainer, each stage set up anew (configure_pipeline builds new containers around the
    sharded blocks every time): validate before the fit (the stages sharded there, the fit reuses them), the fit,
    then predict, test and validate after it. Evaluation: each dp rank's share of 50 samples (batches of 12, 12,
    1) through both sharded stages."""
    out: dict = {}
    task, losses = PipeNet(2), Losses()
    strategy = PipelineStrategy(schedule="1F1B", n_microbatches=2, data_parallel_size=2)
    trainer = Trainer(
        strategy=strategy, devices=world, max_epochs=1, precision="64-true", callbacks=[losses], **FAST
    )

    def evaluate(stage: str) -> torch.Tensor:
        loader = DataLoader(data(50), batch_size=BATCH)
        if stage == "predict":
            return torch.cat(trainer.predict(task, loader))
        task.eval_outputs = []
        getattr(trainer, stage)(task, loader, verbose=False)
        return torch.cat(task.eval_outputs)

    out["pp_fsdp_val_before"] = evaluate("validate")
    trainer.fit(task, DataLoader(data(48), batch_size=BATCH // 2))
    out["pp_fsdp"] = _full({k: v.detach().clone() for k, v in task.state_dict().items() if not v.is_meta})
    out["pp_fsdp_losses"] = losses.losses
    out["pp_fsdp_sampler"] = (trainer.train_dataloader.sampler.num_replicas, trainer.strategy.dp_rank)
    for stage in ("predict", "test", "validate"):
        out[f"pp_fsdp_{stage}"] = evaluate(stage)
    return out


def _pipelines(rank: int, world: int, path: str) -> dict:
    out: dict = {}
    for schedule, per_rank in (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2)):
        strategy = PipelineStrategy(schedule=schedule, n_microbatches=4, stages_per_rank=per_rank)
        trainer, out[schedule], out[f"{schedule}_losses"] = _fit(strategy, world, world * per_rank)
        out[f"{schedule}_stages"] = trainer.strategy.stage_indices
    strategy = PipelineStrategy(schedule="1F1B", n_microbatches=4)
    _, out["fp32"], out["fp32_losses"] = _fit(strategy, world, world, precision="32-true", opt="sgd")
    if world == 4:  # pipeline x FSDP: pp=2 stages, each sharded over dp=2; the global batch split over dp
        out.update(_pipeline_fsdp(world))
        return out
    # checkpoint after epoch 1, resumed for epoch 2: the same as 2 epochs in one go
    _, out["two_epochs"], _ = _fit(PipelineStrategy(n_microbatches=4), world, world, epochs=2)
    trainer, _, _ = _fit(PipelineStrategy(n_microbatches=4), world, world)
    trainer.save_checkpoint(f"{path}/pipe.ckpt")
    trainer, out["resumed"], _ = _fit(
        PipelineStrategy(n_microbatches=4), world, world, epochs=2, ckpt=f"{path}/pipe.ckpt"
    )
    out["resumed_step"] = trainer.global_step
    interleaved = PipelineStrategy(
        schedule="Interleaved1F1B", n_microbatches=4
    )  # 4 stages from 2 stages' file
    _, out["restaged"], _ = _fit(interleaved, world, 2 * world, epochs=2, ckpt=f"{path}/pipe.ckpt")
    # a last batch of another size: refused before any step (50 samples = 4 x 12 + 2)
    try:
        trainer, _, losses = _fit(PipelineStrategy(n_microbatches=4), world, world, n=50)
        out["last_batch"] = f"no error after {len(losses)} steps"
    except ConfigError as e:
        out["last_batch"] = str(e)
    return out


def _full_on(out: list, key: str) -> dict:
    """Every rank's stages of `key` merged into the whole model's weights."""
    merged: dict = {}
    for r in out:
        merged.update(r[key])
    return merged


def _reference(precision="64-true", opt="adam", epochs=1):
    return _fit("single", 1, 1, precision=precision, opt=opt, epochs=epochs)


def _close(own: dict, ref: dict, atol: float) -> float:
    worst = 0.0
    for k, v in own.items():
        worst = max(worst, float((v - ref[k]).abs().max()))
    assert worst <= atol, worst
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_pipeline_schedules_match_one_process(world, tmp_path):
    out = run_distributed(_pipelines, str(tmp_path), world_size=world, timeout=400)
    _, ref, ref_losses = _reference()
    _, ref32, ref32_losses = _reference("32-true", "sgd")
    for schedule, per_rank in (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2)):
        covered = set()
        for rank, r in enumerate(out):
            assert r[f"{schedule}_stages"] == [rank + k * world for k in range(per_rank)]
            _close(r[schedule], ref, 1e-12)
            covered |= set(r[schedule])
            assert max(abs(a - b) for a, b in zip(r[f"{schedule}_losses"], ref_losses)) <= 1e-12
            assert len(r[f"{schedule}_losses"]) == 4
        assert covered == set(ref), schedule  # every parameter lives on one rank
    for r in out:
        _close(r["fp32"], ref32, 1e-5)
        assert max(abs(a - b) for a, b in zip(r["fp32_losses"], ref32_losses)) <= 1e-5
    if world == 4:
        for r in out:
            _close(r["pp_fsdp"], ref, 1e-12)
            assert max(abs(a - b) for a, b in zip(r["pp_fsdp_losses"], ref_losses)) <= 1e-12
        assert [r["pp_fsdp_sampler"] for r in out] == [(2, 0), (2, 1), (2, 0), (2, 1)]
        x = data(50).tensors[0]
        with torch.no_grad():  # one process, float64: the initial weights, then the trained ones
            before = PipeNet().double()(x)
            model = PipeNet().double()
            model.load_state_dict(ref)
            after = model(x)
        for rank, r in enumerate(out):  # rank = pp_rank x 2 + dp_rank; dp rank d's samples are d, d + 2, ...
            for key, expected in [
                ("val_before", before),
                ("predict", after),
                ("test", after),
                ("validate", after),
            ]:
                mine = expected[rank % 2 :: 2]
                assert r[f"pp_fsdp_{key}"].shape == mine.shape == (25, 3), (key, r[f"pp_fsdp_{key}"].shape)
                assert float((r[f"pp_fsdp_{key}"] - mine).abs().max()) <= 1e-12, (rank, key)
        return
    for r in out:
        assert r["resumed_step"] == 8
        for k, v in r["resumed"].items():
            assert torch.equal(v, r["two_epochs"][k]), k
        assert "last batch of 2" in r["last_batch"] and "drop_last=True" in r["last_batch"], r["last_batch"]
        _close(r["restaged"], _full_on(out, "two_epochs"), 1e-12)  # 2 stages saved, 4 resumed
    # the pipeline's file resumes in one process too (its weights and AdamW state are the plain forms)
    _, alone, _ = _fit("single", 1, 1, epochs=2, ckpt=str(tmp_path / "pipe.ckpt"))
    _close(alone, _full_on(out, "two_epochs"), 1e-12)


def test_pipeline_options_are_checked():
    with pytest.raises(ConfigError, match="schedule='ZB'"):
        PipelineStrategy(schedule="ZB")
    with pytest.raises(ConfigError, match="n_microbatches"):
        PipelineStrategy(n_microbatches=0)
    with pytest.raises(ConfigError, match="Interleaved1F1B"):
        PipelineStrategy(schedule="1F1B", stages_per_rank=2)
    with pytest.raises(ConfigError, match="at least 2"):
        PipelineStrategy(schedule="Interleaved1F1B", stages_per_rank=1)
    with pytest.raises(ConfigError, match="data_parallel_size"):
        PipelineStrategy(data_parallel_size=0)
    assert PipelineStrategy(schedule="Interleaved1F1B").stages_per_rank == 2
    s = resolve_strategy("pipeline", {"accelerator": "cpu", "devices": 2})
    assert isinstance(s, PipelineStrategy) and s.schedule_name == "1F1B"


def test_pipeline_task_and_batch_checks():
    from strategies.pipeline_checks import check_batch, check_loader, check_task

    task = PipeNet(2)
    assert len(check_task(task, 2, 2, 1)) == 2
    with pytest.raises(ConfigError, match="returned 2 stages.*= 4"):
        check_task(task, 4, 4, 1)

    class Partial(PipeNet):
        def configure_pipeline(self):
            return super().configure_pipeline()[:1] + [torch.nn.Sequential(*self.blocks[4:])]

    with pytest.raises(TaskError, match="leave out parameters.*head"):
        check_task(Partial(2), 2, 2, 1)
    with pytest.raises(TaskError, match="configure_pipeline"):
        check_task(Task(), 2, 2, 1)
    with pytest.raises(ConfigError, match="batch_size=10 is not divisible by n_microbatches=4"):
        check_loader(DataLoader(data(), batch_size=10), 4)
    with pytest.raises(ConfigError, match="last batch of 2.*batch_size=12.*drop_last=True"):
        check_loader(DataLoader(data(50), batch_size=12), 4)
    check_loader(DataLoader(data(50), batch_size=12, drop_last=True), 4)
    assert check_batch(torch.zeros(12, 6), None, 4) == 12
    with pytest.raises(TaskError, match="a batch of 8 samples after batches of 12"):
        check_batch(torch.zeros(8, 6), 12, 4)
    with pytest.raises(TaskError, match="cannot be split into n_microbatches=4"):
        check_batch(torch.zeros(6, 6), None, 4)


def test_a_stage_set_up_again_keeps_its_sharded_container():
    """configure_pipeline() builds new containers on every call; under pipeline x FSDP the stage set up (and
    sharded) before must be used again, not the new container around its sharded modules (fully_shard on it fails:
    "Cannot concatenate overlapping meshes" at 4 ranks; the whole run: test_pipeline_schedules_match_one_process)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from strategies.large.stages import reuse_stages

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    task = PipeNet(2)
    first = task.configure_pipeline()
    fully_shard(first[0], mesh=init_device_mesh("cpu", (1,)))  # stage 0 sharded; stage 1 on another rank
    with torch.no_grad():  # an evaluation's forward leaves a root's parameters gathered (teardown reshards)
        first[0](torch.zeros(2, 6))
    again = task.configure_pipeline()
    assert again[0] is not first[0]
    reused = reuse_stages(again, {0: first[0]})
    assert reused[0] is first[0] and reused[1] is again[1]
    first[0].reshard()
    assert reuse_stages([first[0], again[1]], {})[0] is first[0]  # a sharded container the task returns again
    with pytest.raises(TaskError, match="stage 0 holds parameters that a PipelineStrategy sharded already"):
        reuse_stages(again, {})  # another Trainer: nothing of it to reuse
    other = [
        torch.nn.Sequential(task.inp, *task.blocks[:3]),
        torch.nn.Sequential(*task.blocks[3:], task.head),
    ]
    with pytest.raises(TaskError, match="the same stages"):
        reuse_stages(other, {0: first[0]})  # another split
