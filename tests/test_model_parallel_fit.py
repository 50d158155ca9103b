"""ModelParallelStrategy at world sizes 1, 2 and 4 against one process and against an uninterrupted run: TP on
an MLP and on a transformer block with SequenceParallel, FSDP x TP on (2, 2), loss_parallel, gradient clipping
by norm and by value on mixed meshes, DCP directories and gathered files saved at (2, 2) and resumed at (1, 2),
(2, 1), (1, 1), (4, 1) and (1, 4), and a rank killed under torchrun resuming with resume="auto".
Process start dominates (4-36 s): one spawn per world size checks many things."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from callbacks import Callback
from strategies.model_parallel import ModelParallelStrategy
from tandem_core.errors import TaskError
from tests.conftest import FAST, free_port, run_distributed
from trainer import Trainer
from trainer.checkpoint import load

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "mp_train.py")
sys.path.insert(0, os.path.join(HERE, "scripts"))
from mp_train import CLASSES, MPTask, StartStep, full_state, make_data, parallelize, reference  # noqa: E402

GLOBAL = 8  # global batch: 6 steps per epoch of 48 samples at any data-parallel size
NORM, VALUE = (0.05, "norm"), (0.01, "value")  # small enough that every step clips


class SaveAt(Callback):
    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def _fit(
    task, world, dp, tp, steps=5, clip=NORM, ckpt_path=None, callbacks=(), accumulate=1, **strategy_kwargs
):
    start = StartStep()
    trainer = Trainer(
        strategy=ModelParallelStrategy(dp, tp, timeout=120, **strategy_kwargs),
        devices=world,
        precision="64-true" if task.net.head.weight.dtype == torch.float64 else "32-true",
        max_steps=steps,
        gradient_clip_val=clip[0],
        gradient_clip_algorithm=clip[1],
        callbacks=[start, *callbacks],
        accumulate_grad_batches=accumulate,
        **FAST,
    )
    data = make_data(task.net.head.weight.dtype)
    trainer.fit(task, DataLoader(data, batch_size=GLOBAL // dp // accumulate), ckpt_path=ckpt_path)
    return trainer, start.step


def _parity(world, dp, tp, kind, dtype, opt, clip, callbacks=(), **kwargs):
    """Largest differences from one process on the same global batches: loss per step (the mean over the
    data-parallel ranks' local losses), global gradient norm before clipping, final weights; and those
    weights, gathered."""
    task = MPTask(
        kind, dtype, opt, loss_parallel=kwargs.pop("task_loss_parallel", kwargs.get("loss_parallel", False))
    )
    trainer, _ = _fit(task, world, dp, tp, clip=clip, callbacks=callbacks, **kwargs)
    state = full_state(task)
    every: list[list[float]] = [[] for _ in range(world)]
    dist.all_gather_object(every, task.losses)
    losses = [sum(r[i] for r in every) / world for i in range(len(task.losses))]  # tp copies weigh alike
    ref_losses, ref_norms, ref_state = reference(kind, dtype, opt, 5, GLOBAL, clip)
    assert len(losses) == len(task.norms) == 5 and state.keys() == ref_state.keys()
    return {
        "loss": max(abs(a - b) for a, b in zip(losses, ref_losses)),
        "norm": max(abs(a - b) for a, b in zip(task.norms, ref_norms)),
        "weights": max((state[k] - ref_state[k]).abs().max().item() for k in ref_state),
        "units": list(trainer.strategy.units),
        "mesh": trainer.strategy.device_mesh.mesh_dim_names,
        "sampler": trainer.strategy.distributed_sampler_kwargs,
    }, state


def _resume(world, dp, tp, path) -> dict[str, object]:
    task = MPTask("transformer")
    trainer, started = _fit(task, world, dp, tp, ckpt_path=path)
    return {"state": full_state(task), "started": started, "steps": trainer.global_step}


def _at_4(rank: int, world: int, root: str) -> dict[str, object]:
    out: dict[str, object] = {}
    # FSDP x TP on (2, 2), float64 AdamW; saves a DCP directory at step 3 of the uninterrupted run
    save = SaveAt(3, os.path.join(root, "dir.ckpt"))
    out["transformer"], out["uninterrupted"] = _parity(
        world, 2, 2, "transformer", torch.float64, "adamw", NORM, callbacks=[save]
    )
    # the MLP's head is sharded on the dp mesh only, the rest on (dp, tp): mixed meshes in clipping
    out["mlp_norm"], _ = _parity(world, 2, 2, "mlp", torch.float64, "adamw", NORM)
    out["mlp_value_f32"], _ = _parity(world, 2, 2, "mlp", torch.float32, "sgd", VALUE)
    # the same point as one gathered file
    task = MPTask("transformer")
    _fit(task, world, 2, 2, steps=3, save_distributed_checkpoint=False,
         callbacks=[SaveAt(3, os.path.join(root, "full.ckpt"))])  # fmt: skip
    out["resumed_4x1"] = _resume(world, 4, 1, os.path.join(root, "dir.ckpt"))
    out["resumed_1x4"] = _resume(world, 1, 4, os.path.join(root, "dir.ckpt"))
    return out


@pytest.fixture(scope="module")
def at_4(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mp_ckpt"))
    return root, run_distributed(_at_4, root, world_size=4, timeout=900)


class TPOnly(MPTask):
    """Tensor parallel only, whatever the mesh: with dp > 1 its replicas' gradients would never meet."""

    def configure_model(self) -> None:
        parallelize(self.net, self.device_mesh, fsdp=False)


def _lightning_oracle(world: int) -> float:
    """Lightning's own ModelParallelStrategy (gloo) and Tandem's on the same task and shuffled loader:
    the largest weight difference after 5 AdamW steps."""
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import ModelParallelStrategy as LightningMP

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = MPTask("transformer").net  # the same seeded initial weights

        def configure_model(self) -> None:
            parallelize(self.net, self.device_mesh)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x).reshape(-1, CLASSES), y.reshape(-1))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.1)

    ours = MPTask("transformer")
    Trainer(strategy=ModelParallelStrategy(1, world), devices=world, max_steps=5, **FAST).fit(
        ours, DataLoader(make_data(), batch_size=GLOBAL, shuffle=True)
    )
    lit, environ = Lit(), dict(os.environ)
    pl.Trainer(
        strategy=LightningMP(data_parallel_size=1, tensor_parallel_size=world), accelerator="cpu", devices=world,
        max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,  # float64 weights, 32-true
        enable_model_summary=False,
    ).fit(lit, DataLoader(make_data(), batch_size=GLOBAL, shuffle=True))  # fmt: skip
    os.environ.clear()
    os.environ.update(environ)  # Lightning's teardown deletes WORLD_SIZE
    theirs, mine = full_state(lit.net), full_state(ours.net)
    return max((theirs[k] - mine[k]).abs().max().item() for k in mine)


def _accumulated(world: int) -> float:
    """FSDP on (2, 1) with 2 micro-batches per step (gradient sync skipped on the first) against one process
    on the whole global batches: the largest weight difference after 5 clipped AdamW steps."""
    task = MPTask("mlp")
    _fit(task, world, world, 1, accumulate=2)
    state, ref = full_state(task), reference("mlp", torch.float64, "adamw", 5, GLOBAL, NORM)[2]
    return max((state[k] - ref[k]).abs().max().item() for k in ref)


def _at_2(rank: int, world: int, root: str) -> dict[str, object]:
    out: dict[str, object] = {"lightning": _lightning_oracle(world), "accumulated": _accumulated(world)}
    out["loss_parallel"], _ = _parity(
        world, 1, 2, "transformer", torch.float64, "adamw", NORM, loss_parallel=True
    )
    out["step_loss_parallel"], _ = _parity(
        world, 1, 2, "transformer", torch.float64, "adamw", NORM, task_loss_parallel="step"
    )  # detected: no option, no backward override
    out["transformer_f32"], _ = _parity(world, 1, 2, "transformer", torch.float32, "sgd", NORM)
    out["mlp_f32"], _ = _parity(world, 1, 2, "mlp", torch.float32, "sgd", NORM)  # plain head next to DTensors
    out["mlp_value"], _ = _parity(world, 1, 2, "mlp", torch.float64, "adamw", VALUE)
    for dp, tp in ((1, 2), (2, 1)):
        out[f"resumed_{dp}x{tp}"] = _resume(world, dp, tp, os.path.join(root, "dir.ckpt"))
    out["resumed_file_2x1"] = _resume(world, 2, 1, os.path.join(root, "full.ckpt"))
    try:
        _fit(TPOnly("mlp"), world, 2, 1)
    except TaskError as e:
        out["tp_only_error"] = str(e)
    return out


def _at_1(rank: int, world: int, root: str) -> dict[str, object]:
    return {
        "resumed_1x1": _resume(world, 1, 1, os.path.join(root, "dir.ckpt")),
        "resumed_file_1x1": _resume(world, 1, 1, os.path.join(root, "full.ckpt")),
    }


def _check_parity(result: dict[str, float], tol: float) -> None:
    assert result["loss"] <= tol and result["weights"] <= tol, result
    assert result["norm"] <= (1e-12 if tol <= 1e-10 else tol), result  # the global norm is one process's


def _check_resumed(resumed: dict[str, object], uninterrupted: dict[str, torch.Tensor]) -> None:
    assert (resumed["started"], resumed["steps"]) == (3, 5)  # at the saved step, two more
    state = resumed["state"]
    for k, v in uninterrupted.items():
        assert (state[k] - v).abs().max().item() <= 1e-10, k


@pytest.mark.slow
def test_fsdp_x_tp_on_2x2_matches_one_process_and_resumes_at_4x1_and_1x4(at_4):
    root, results = at_4
    for rank, r in enumerate(results):
        assert r["transformer"]["mesh"] == ("data_parallel", "tensor_parallel")
        assert r["transformer"]["sampler"] == {"num_replicas": 2, "rank": rank // 2}  # row-major (dp, tp)
        for name in ("transformer", "mlp_norm"):
            _check_parity(r[name], 1e-10)
            assert "net" in r[name]["units"]  # FSDP x TP, not TP alone
        _check_parity(r["mlp_value_f32"], 1e-6)
        for name in ("resumed_4x1", "resumed_1x4"):
            _check_resumed(r[name], results[0]["uninterrupted"])
    # a DCP directory, read in one process without a group, equals the gathered file of the same point
    listing = sorted(os.listdir(os.path.join(root, "dir.ckpt")))
    assert listing == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "__2_0.distcp",
        "__3_0.distcp",
        "tandem.pt",
    ]
    sharded, gathered = load(os.path.join(root, "dir.ckpt")), load(os.path.join(root, "full.ckpt"))
    assert sharded["global_step"] == gathered["global_step"] == 3
    assert sharded["state_dict"].keys() == gathered["state_dict"].keys()
    for k, v in gathered["state_dict"].items():
        assert (sharded["state_dict"][k] - v).abs().max().item() <= 1e-12, k


@pytest.mark.slow
def test_tp_loss_parallel_and_clipping_at_2_and_resumes_at_1x2_2x1_and_1x1(at_4):
    root, results4 = at_4
    uninterrupted = results4[0]["uninterrupted"]
    for r in run_distributed(_at_2, root, world_size=2, timeout=600):
        _check_parity(r["loss_parallel"], 1e-10)
        _check_parity(r["step_loss_parallel"], 1e-10)
        _check_parity(r["mlp_value"], 1e-10)
        _check_parity(r["transformer_f32"], 1e-6)
        _check_parity(r["mlp_f32"], 1e-6)
        for name in ("resumed_1x2", "resumed_2x1", "resumed_file_2x1"):
            _check_resumed(r[name], uninterrupted)
        assert "not sharded on the 'data_parallel' mesh dimension" in r["tp_only_error"]
        assert r["lightning"] <= 1e-10  # Lightning's ModelParallelStrategy as an oracle
        assert r["accumulated"] <= 1e-10
    for r in run_distributed(_at_1, root, world_size=1, timeout=300):
        _check_resumed(r["resumed_1x1"], uninterrupted)
        _check_resumed(r["resumed_file_1x1"], uninterrupted)


def _run(cmd: list[str], timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_rank_killed_under_torchrun_resumes_at_the_saved_step_with_resume_auto(tmp_path):
    ref = _run([sys.executable, SCRIPT, str(tmp_path / "ref.pt"), str(tmp_path / "ref")])  # Tandem launches
    assert ref.returncode == 0, ref.stderr[-3000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1"]
    torchrun += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    out, root = str(tmp_path / "killed.pt"), str(tmp_path / "killed")
    killed = _run([*torchrun, SCRIPT, out, root, "--kill-rank", "1", "--kill-step", "5"])
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "SIGKILL" in killed.stderr or "-9" in killed.stderr  # the kill did happen
    a, b = torch.load(tmp_path / "ref.pt"), torch.load(out)
    assert (a["started_at"], a["steps"]) == (0, 8)
    assert (b["started_at"], b["steps"]) == (4, 8)  # resume="auto" found last.ckpt of step 4, not step 0
    for k in a["state"]:
        assert torch.equal(a["state"][k], b["state"][k]), k
