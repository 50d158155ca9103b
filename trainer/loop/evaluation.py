"""Evaluation loops: validation (inside fit or alone), test and predict share `run_eval`."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

import torch

from tandem_core.rank_zero import rank_zero_warn
from trainer.compiler import mark_step
from trainer.loggers.logged import forget
from trainer.loggers.reporting import log_metrics, log_stage_start
from trainer.loop.combined import batches
from trainer.loop.data import set_epoch
from trainer.loop.hooks import run_as
from trainer.loop.loader_iter import eval_feed, takes_loader_iter
from trainer.loop.signals import check_stop, settle_stop, stop_checker
from trainer.loop.signatures import check_dataloader_idx
from trainer.loop.transfer import to_device
from trainer.seed import get_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer

HOOK_PREFIX = {"val": "validation", "test": "test", "predict": "predict"}  # phase -> Lightning's hook names


def evaluate(t: Trainer, stage: str) -> Any:
    """validate(), test() or predict(): one pass over that stage's loaders. As Lightning: the task's
    zero_grad() first; with limit_*_batches=0 (or loaders without batches) no loader hook runs at all."""
    log_stage_start(t)  # hyperparameters and graph: as Lightning, before the stage runs
    t.metric_store.drop_all()  # this stage's metrics only, not an earlier stage's (as Lightning)
    forget(t)
    t.task.zero_grad()  # type: ignore[union-attr]
    phase = {"validate": "val"}.get(stage, stage)
    if getattr(t.config, f"limit_{'val' if phase == 'val' else phase}_batches") == 0:
        out: Any = []
    else:
        t.session.load(phase)  # type: ignore[union-attr]
        out = run_eval(t, phase) if sum(t.loader_sizes.get(phase, [])) else []
    return out


def run_eval(t: Trainer, phase: str, limit: int | None = None) -> Any:
    """One pass over the loaders of `phase` ('val', 'test' or 'predict') without gradients; returns the
    logged epoch metrics per loader, or for predict the outputs. As Lightning, the whole pass (its hooks from
    on_*_model_eval to on_*_model_train too) runs under torch.inference_mode (Trainer(inference_mode=False):
    torch.no_grad); inside fit, and under a gloo process group as in Lightning, under no_grad (validation's
    tensors may meet training's later)."""
    standalone = t.config.inference_mode and t.state.entry != "fit" and not _gloo()
    with torch.inference_mode() if standalone else torch.no_grad():
        return _run_eval(t, phase, limit)


def _run_eval(t: Trainer, phase: str, limit: int | None) -> Any:
    task, strategy, hooks, store = t.task, t.strategy, t.hooks, t.metric_store
    assert task is not None
    prefix = HOOK_PREFIX[phase]
    step_name = f"{prefix}_step"
    check_dataloader_idx(task, prefix, len(t.loaders.get(phase, [])))  # before any hook, as Lightning
    modes = _to_eval(t, prefix)
    store.reset(phase)
    outer_phase, t.state.phase = t.state.phase, phase
    hooks.call(f"on_{prefix}_start")
    # after the hook: a BatchSizeFinder may rebuild the loaders in it (Lightning reads them afterwards too)
    loaders, sizes = t.loaders.get(phase, []), t.loader_sizes.get(phase, [])
    hooks.call(f"on_{prefix}_epoch_start")
    predictions: list[list[Any]] = []
    multi = len(loaders) > 1
    # the ranks agree on a stop request (a signal) after each batch that every rank has
    agree = _common_batches(t, sizes, limit) if not t.state.sanity_checking else 0
    agreeing = agree > 0
    # a stop inside fit's validation checkpoints the moment it started
    start_rng = get_rng_state() if agree and t.state.entry == "fit" else None
    store.fx = step_name  # self.log's rules inside an evaluation batch (trainer/loggers/log_rules.py)
    marked, agree_stop = bool(getattr(t.session, "cudagraphs", False)), stop_checker(t)
    if takes_loader_iter(getattr(task, step_name, None)):  # the step reads the batches (loop/loader_iter.py)
        predictions = _iter_pass(t, phase, loaders, sizes, limit, agree, start_rng)
        loaders = []  # (done)
    for dl_idx, (loader, n) in enumerate(zip(loaders, sizes)):
        set_epoch(loader, t.state.epoch)  # as Lightning: the fit epoch (a sampler may shuffle by it)
        store.dataloader_suffix = f"/dataloader_idx_{dl_idx}" if multi else ""
        extra = (dl_idx,) if multi else ()
        outputs: list[Any] = []
        n = n if limit is None else min(n, limit)
        if n == 0:
            continue
        for batch_idx, batch in enumerate(
            islice(_fetches(t, phase, loader), None if n == float("inf") else int(n))
        ):
            batch = to_device(t, batch, dl_idx)
            store.set_batch(batch)
            hooks.call(f"on_{prefix}_batch_start", batch, batch_idx, *extra)
            if marked:  # CUDA graphs: a new step begins (trainer/compiler.py)
                mark_step()
            with strategy.autocast(), t.profile(step_name):
                out = strategy.step(task, step_name, batch, batch_idx, dl_idx if multi else None)
            if phase == "predict":
                outputs.append(_prediction(out))
            hooks.call(f"on_{prefix}_batch_end", out, batch, batch_idx, *extra)
            if phase != "predict" and not t.state.sanity_checking:  # step values go to the loggers, at
                seen = t.session.eval_batches  # type: ignore[union-attr]  # the batches this loader ran
                done = seen.get((phase, dl_idx), 0)  # since its data was loaded (Lightning's step here)
                log_metrics(t, store.step_metrics(), step=done)
                seen[(phase, dl_idx)] = done + 1
            if agree > 0:
                agree -= 1
                agree_stop(start_rng)
        predictions.append(outputs)
    if agreeing:  # a stop requested in the last batches: every rank stops here, after its last batch
        settle_stop(t, start_rng)
    store.dataloader_suffix = ""
    store.fx = None
    loaders = t.loaders.get(phase, [])
    hooks.call(f"on_{prefix}_epoch_end")
    logged = store.epoch_end()
    results: list[dict[str, float]] = []
    if not t.state.sanity_checking:
        log_metrics(t, logged)
        results = _per_loader({k: float(v) for k, v in logged.items()}, len(loaders), store.loader_of)
    hooks.call(f"on_{prefix}_end")
    _to_train(t, prefix, modes)
    store.switch("train")
    t.state.phase = outer_phase
    if phase == "predict":
        return predictions[0] if len(predictions) == 1 else predictions
    return results


def _prediction(out: Any) -> Any:
    """A predict_step's output; None (a forgotten return) is kept, with Lightning's warning."""
    if out is None:
        rank_zero_warn("predict_step returned None: if that is on purpose, ignore this warning")
    return out


def _to_eval(t: Trainer, prefix: str) -> list[tuple[torch.nn.Module, bool]]:
    """The task in eval mode (through on_*_model_eval where the task overrides it); every submodule's own mode
    before, to restore afterwards."""
    task = t.task
    modes = [(m, m.training) for m in task.modules()]  # type: ignore[union-attr]
    if f"on_{prefix}_model_eval" in t.hooks.custom:
        run_as(t, f"on_{prefix}_model_eval", getattr(task, f"on_{prefix}_model_eval"))
    else:
        task.eval()  # type: ignore[union-attr]
    return modes


def _to_train(t: Trainer, prefix: str, modes: list[tuple[torch.nn.Module, bool]]) -> None:
    """Back from evaluation: on_*_model_train where the task overrides it, else, as Lightning, each submodule
    back to its own mode (a frozen BatchNorm stays in eval)."""
    if f"on_{prefix}_model_train" in t.hooks.custom:
        run_as(t, f"on_{prefix}_model_train", getattr(t.task, f"on_{prefix}_model_train"))
    else:
        for module, training in modes:
            module.training = training


def _gloo() -> bool:
    """Whether the process group is gloo's, under which Lightning evaluates with no_grad, not inference_mode."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"


_FETCH_KEYS = {"val": "[_EvaluationLoop].val_next", "test": "[_EvaluationLoop].test_next",
               "predict": "[_PredictionLoop].predict_next"}  # fmt: skip


def _fetches(t: Trainer, phase: str, loader: Any) -> Any:
    """The loader's batches; with a profiler on, each fetch timed under Lightning's key."""
    it = batches(loader)
    return it if t.profiler is None else t.profiler.fetches(_FETCH_KEYS[phase], it)


def _iter_pass(
    t: Trainer, phase: str, loaders: list[Any], sizes: list[Any], limit: int | None, agree: int, rng: Any
) -> list[list[Any]]:
    """The pass of a `dataloader_iter` step: one iterator over every loader in turn; a step per turn until the
    iterator is exhausted (or a step lets StopIteration out). The batch hooks get the batch fetched last; the
    outputs of predict go to the loader of the batch the step fetched last."""
    task, strategy, hooks, store, prefix = t.task, t.strategy, t.hooks, t.metric_store, HOOK_PREFIX[phase]
    step_name, multi = f"{prefix}_step", len(loaders) > 1
    for loader in loaders:
        set_epoch(loader, t.state.epoch)
    feed = eval_feed(loaders, [n if limit is None else min(n, limit) for n in sizes], batches)
    outputs: list[list[Any]] = [[] for _ in loaders]
    while not feed.done:
        dl_idx = feed.dataloader_idx
        store.dataloader_suffix = f"/dataloader_idx_{dl_idx}" if multi else ""
        store.set_batch(feed.batch)
        hooks.call(f"on_{prefix}_batch_start", feed.batch, feed.batch_idx, *((dl_idx,) if multi else ()))
        try:
            if getattr(t.session, "cudagraphs", False):  # CUDA graphs: a new step begins
                mark_step()
            with strategy.autocast(), t.profile(step_name):
                out = strategy.step(task, step_name, feed, feed.batch_idx)  # type: ignore[arg-type]
        except StopIteration:
            break
        dl_idx = feed.dataloader_idx
        if phase == "predict":
            outputs[dl_idx].append(_prediction(out))
        hooks.call(f"on_{prefix}_batch_end", out, feed.batch, feed.batch_idx, *((dl_idx,) if multi else ()))
        if phase != "predict" and not t.state.sanity_checking:
            seen = t.session.eval_batches  # type: ignore[union-attr]
            done = seen.get((phase, dl_idx), 0)
            log_metrics(t, store.step_metrics(), step=done)
            seen[(phase, dl_idx)] = done + 1
        if agree > 0:
            agree -= 1
            check_stop(t, rng)
    return outputs


def _common_batches(t: Trainer, sizes: list[int | float], limit: int | None) -> int:
    """How many batches of this evaluation every rank runs (ranks' shards may differ by a batch)."""
    total = sum(min(n, limit) if limit is not None else n for n in sizes)
    if total == float("inf"):
        return 0
    comm = t.strategy.comm
    return (
        int(total)
        if comm.world_size == 1
        else int(comm.all_gather(torch.tensor([int(total)], device=t.strategy.root_device)).min())
    )


def _per_loader(
    values: dict[str, float], n_loaders: int, loader_of: Callable[[str], int | None]
) -> list[dict[str, float]]:
    """One dict per loader (Lightning's result shape): what was logged in its batches (with or without the
    '/dataloader_idx_i' suffix) plus what was logged outside them (shared by all)."""
    if n_loaders <= 1:
        return [values]
    owner = {k: loader_of(k) for k in values}
    return [{k: v for k, v in values.items() if owner[k] is None or owner[k] == i} for i in range(n_loaders)]
