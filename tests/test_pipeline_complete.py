"""PipelineStrategy completed: mixed precision (bf16-mixed, 16-mixed: autocast in every stage, the loss scaled,
the gradients unscaled and an inf on one rank's stage skipping the step on every rank), validation, test and
predict steps run through the stages, and gradient clipping by the global norm over all stages; each against
one process on the same batches. One spawn of 2 ranks checks all of it (1F1B and interleaved stages)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader

from strategies.pipeline import PipelineStrategy
from strategies.pipeline_eval import meta_error
from tests.conftest import FAST, run_distributed
from tests.test_pipeline import BATCH, Block, Losses, PipeNet, data
from trainer import Trainer

CLIP = 0.05  # well below the gradients' norm (about 0.5 to 2): every step is clipped


class EvalNet(PipeNet):
    """PipeNet with evaluation steps that call self(x), and records of gradients, dtypes and weights."""

    def __init__(
        self, n_stages: int = 2, opt: str = "adam", poison: int | None = None, scale: float = 1.0
    ) -> None:
        super().__init__(n_stages, opt)
        self.poison = poison  # at this batch, an inf enters the head's weight gradient (the last stage only)
        self.scale = scale  # of the loss: 1e-3 keeps fp16's gradients finite at the scaler's first scale
        self.grads: list[dict] = []
        self.clipped: list[dict] = []
        self.weights: list[dict] = []
        self.dtypes: set[tuple[str, str]] = set()
        self.scales: list[float] = []

    def pipeline_loss(self, output, target):
        return super().pipeline_loss(output, target) * self.scale

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", self.pipeline_loss(self(x), y), batch_size=len(x))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/loss", self.pipeline_loss(self(x), y), batch_size=len(x))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def on_train_start(self):
        for name, m in self.named_modules():
            if isinstance(m, (torch.nn.Linear, Block)) and not next(m.parameters()).is_meta:
                m.register_forward_hook(self._record(name))
        self._hooks = []
        if self.poison is not None and not self.head.weight.is_meta:
            self._hooks.append(
                self.head.weight.register_hook(lambda g: g * math.inf if self._poisoned else g)
            )

    def on_train_end(self):
        for h in self._hooks:  # (a hook holding the task on its parameter is a cycle gc cannot see)
            h.remove()

    def _record(self, name):
        def hook(module, args, output):
            if torch.is_grad_enabled():  # training forwards only
                self.dtypes.add((name, f"in {args[0].dtype} out {output.dtype}"))

        return hook

    def on_train_batch_start(self, batch, batch_idx):
        self._poisoned = batch_idx == self.poison

    def on_before_optimizer_step(self, optimizer):
        self.grads.append(_own(self, grad=True))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.clipped.append(_own(self, grad=True))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.weights.append(_own(self))
        scaler = self.trainer.strategy.precision.scaler
        self.scales.append(scaler.get_scale() if scaler is not None else 1.0)


def _own(task, grad=False) -> dict:
    """This rank's parameters (or their gradients), whole tensors."""
    from torch.distributed.tensor import DTensor

    out = {}
    for n, p in task.named_parameters():
        t = p.grad if grad else p
        if t is None or t.is_meta:
            continue
        out[n] = (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
    return out


def _loader(n=48, dtype=torch.float64, batch=BATCH):
    return DataLoader(data(n, dtype), batch_size=batch)


def _run(strategy, devices, n_stages, precision="64-true", poison=None, evaluate=False, **kw):
    low = precision in ("bf16-mixed", "16-mixed", "32-true")  # compared with each other, at a small loss
    task, losses = EvalNet(n_stages, poison=poison, scale=1e-3 if low else 1.0), Losses()
    trainer = Trainer(
        strategy=strategy,
        devices=devices,
        max_epochs=1,
        precision=precision,
        callbacks=[losses],
        **FAST,
        **kw,
    )
    dtype = torch.float64 if precision == "64-true" else torch.float32
    val = _loader(50, dtype) if evaluate else None  # a last batch of 2: fewer rows than micro-batches
    trainer.fit(task, _loader(dtype=dtype), val)
    out = {"task": task, "losses": losses.losses, "scaler": type(trainer.strategy.precision.scaler).__name__}
    if evaluate:
        out["fit_val"] = float(trainer.callback_metrics["val/loss"])
        trainer.validate(task, _loader(50, dtype), verbose=False)
        out["val"] = float(trainer.callback_metrics["val/loss"])
        trainer.test(task, _loader(50, dtype), verbose=False)
        out["test"] = float(trainer.callback_metrics["test/loss"])
        out["predict"] = torch.cat(trainer.predict(task, _loader(50, dtype)))
    return out


def _summary(out: dict) -> dict:
    task = out.pop("task")
    return {**out, "grads": task.grads, "clipped": task.clipped, "weights": task.weights,
            "dtypes": sorted(task.dtypes), "scales": task.scales}  # fmt: skip


def _spawned(rank: int, world: int) -> dict:
    res = {}
    one_f_one_b = PipelineStrategy(n_microbatches=4)
    res["clip"] = _summary(_run(one_f_one_b, world, world, gradient_clip_val=CLIP, evaluate=True))
    interleaved = PipelineStrategy(schedule="Interleaved1F1B", n_microbatches=4)
    res["clip_4"] = _summary(_run(interleaved, world, 2 * world, gradient_clip_val=CLIP, evaluate=True))
    for precision in ("bf16-mixed", "16-mixed", "32-true"):
        res[precision] = _summary(_run(PipelineStrategy(n_microbatches=4), world, world, precision))
    res["poisoned"] = _summary(_run(PipelineStrategy(n_microbatches=4), world, world, "16-mixed", poison=2))
    return res


def _reference(**kw) -> dict:
    return _summary(_run("single", 1, 1, **kw))


def _merged(ranks: list[dict], key: str, field: str) -> list[dict]:
    """Every rank's per-step records of `field` merged into whole-model dicts."""
    steps = len(ranks[0][key][field])
    return [{k: v for r in ranks for k, v in r[key][field][i].items()} for i in range(steps)]


def _worst(a: list[dict], b: list[dict]) -> float:
    assert len(a) == len(b) and all(x.keys() == y.keys() for x, y in zip(a, b))
    return max(float((x[k] - y[k]).abs().max()) for x, y in zip(a, b) for k in x)


@pytest.mark.slow
def test_pipeline_precision_evaluation_and_clipping_match_one_process():
    ranks = run_distributed(_spawned, world_size=2, timeout=400)
    ref = _reference(gradient_clip_val=CLIP, evaluate=True)
    seen: dict[str, float] = {}  # the worst differences measured, printed for the docs

    def worst(name: str, value: float) -> float:
        seen[name] = max(seen.get(name, 0.0), value)
        return value

    for key in ("clip", "clip_4"):
        for (
            r
        ) in ranks:  # validation (inside fit and alone), test and predict: through the stages, = one process
            for name in ("fit_val", "val", "test"):
                assert worst(name, abs(r[key][name] - ref[name])) <= 1e-12, (
                    key,
                    name,
                    r[key][name],
                    ref[name],
                )
            assert r[key]["predict"].shape == ref["predict"].shape == (50, 3)
            assert worst("predict", float((r[key]["predict"] - ref["predict"]).abs().max())) <= 1e-12
        grads, clipped = _merged(ranks, key, "grads"), _merged(ranks, key, "clipped")
        assert worst("grads", _worst(grads, ref["grads"])) <= 1e-12  # before clipping: one process's
        for g, c, ref_g in zip(grads, clipped, ref["grads"]):
            norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in g.values()))
            ref_norm = float(torch.nn.utils.get_total_norm(list(ref_g.values())))
            relative = worst("norm (relative)", abs(norm - ref_norm) / ref_norm)
            assert relative <= 1e-12 and norm > 5 * CLIP  # the global norm, clipped
            seen["norm min"] = min(seen.get("norm min", math.inf), norm)
            clipped_norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in c.values()))
            # every stage scaled by the global norm, not its own
            assert worst("clipped norm - clip", abs(clipped_norm - CLIP)) <= 1e-6
        assert worst("clipped grads", _worst(clipped, ref["clipped"])) <= 1e-12
        assert worst("weights", _worst(_merged(ranks, key, "weights"), ref["weights"])) <= 1e-12
    ref32 = ranks[0]["32-true"]["losses"]
    for precision, low in (("bf16-mixed", "torch.bfloat16"), ("16-mixed", "torch.float16")):
        for rank, r in enumerate(ranks):
            dtypes = dict(r[precision]["dtypes"])
            assert dtypes, rank  # every stage computed under autocast: each Linear's output in low precision
            linear = [d for n, d in dtypes.items() if not n.startswith("blocks.") or n.endswith(".fc")]
            assert linear and all(d.endswith(f"out {low}") for d in linear), (precision, rank, dtypes)
            if rank == 1:  # the activations crossing from stage 0 arrive in low precision
                assert dtypes["blocks.4"].startswith(f"in {low}"), dtypes["blocks.4"]
            losses = r[precision]["losses"]
            assert losses != ref32 and losses == pytest.approx(ref32, rel=3e-2)
            worst(
                f"{precision} loss vs 32-true (relative)", max(abs(a / b - 1) for a, b in zip(losses, ref32))
            )
            print(f"{precision} rank {rank} (stage {rank}): {dtypes}")
        assert ranks[0][precision]["losses"] == ranks[1][precision]["losses"]
    for r in ranks:
        assert r["16-mixed"]["scaler"] == r["poisoned"]["scaler"] == "ShardedGradScaler"
        assert r["16-mixed"]["scales"] == [65536.0] * 4  # no step skipped in the clean run
        assert r["poisoned"]["scales"] == [65536.0, 65536.0, 32768.0, 32768.0]  # both ranks skipped step 3
    print("worst over both ranks, 1F1B and 4 interleaved stages:", {k: f"{v:.3g}" for k, v in seen.items()})
    stage0 = ranks[0]["poisoned"]["weights"]  # rank 0's gradients were finite, yet it skipped the step too
    assert all(torch.equal(stage0[1][k], stage0[2][k]) for k in stage0[1])
    assert not all(torch.equal(stage0[2][k], stage0[3][k]) for k in stage0[2])


def test_an_evaluation_step_using_another_ranks_module_is_explained():
    err = meta_error("validation_step", NotImplementedError("Cannot copy out of meta tensor; no data!"))
    assert err is not None and "self(x)" in str(err) and "validation_step" in str(err)
    assert meta_error("validation_step", RuntimeError("shape mismatch")) is None


def test_clipping_by_a_partitioned_norm_in_one_process_is_torchs(tmp_path):
    import torch.distributed as dist

    from strategies.clipping import clip_grad_norm_partitioned

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3, generator=g, dtype=torch.float64)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, p in zip(copies, params):
        c.grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(copies, 0.5)
    total = clip_grad_norm_partitioned(params, 0.5, dist.group.WORLD)
    assert abs(float(total) - float(expected)) <= 1e-15 * float(expected) and float(expected) > 0.5
    assert all(float((p.grad - c.grad).abs().max()) <= 1e-15 for p, c in zip(params, copies))


def test_stage_outputs_cross_ranks_with_their_shapes_and_dtypes():
    from strategies.pipeline_eval import _cat, _header, _parse, _split

    tensors = (torch.zeros(3, 4, 5, dtype=torch.bfloat16), torch.ones(3, dtype=torch.int64))
    specs, is_tuple = _parse(_header(tensors, True).tolist())
    assert specs == [(torch.bfloat16, [3, 4, 5]), (torch.int64, [3])] and is_tuple
    x, y = torch.arange(10.0).reshape(5, 2), torch.tensor(2.0)
    chunks = _split((x, y), 5, 4)  # 5 rows into 4 micro-batches: 2, 1, 1, 1; a 0-dim argument goes whole
    assert [c[0].shape[0] for c in chunks] == [2, 1, 1, 1] and all(c[1] is y for c in chunks)
    assert torch.equal(_cat([c[0] for c in chunks]), x)
