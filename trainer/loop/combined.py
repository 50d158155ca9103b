"""Several training or evaluation loaders (a dict, a list, nested, or a CombinedLoader): wrapping them as
Lightning does, counting their batches, and resuming a combined training epoch exactly where it stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from strategies.data.reinit import rebuild, rebuildable
from tandem_core.errors import CheckpointError, ConfigError
from trainer.loop.data import SkipBatchSampler, num_batches
from trainer.seed import set_rng_state
from trainer.utilities.combined_loader import CombinedLoader, _is_leaf, _Walk, sized_len, stateful

if TYPE_CHECKING:
    from trainer.loop.state import LoopState


def is_collection(loaders: Any) -> bool:
    """A CombinedLoader, or a dict/list/tuple of loaders: any that is not a leaf (one holding only numbers and
    strings is one loader of those batches, as Lightning's). Each element is then a loader of its own, checked
    when prepared: a list of tensors is two loaders of their rows, and `[1, object()]` a TypeError naming the
    first that cannot be iterated, as Lightning's (``{"a": [0, 1], "b": [2, 3]}``: two loaders)."""
    if isinstance(loaders, CombinedLoader):
        return True
    return isinstance(loaders, (dict, list, tuple)) and not _is_leaf(loaders)


def combine_train(loaders: Any, prepare: Callable[[Any], Any], limit: int | float) -> CombinedLoader:
    """The training loaders as one CombinedLoader ("max_size_cycle" unless given one in another mode), each
    inner loader prepared (sharded, seeded), the limit applied to each (Lightning's counting)."""
    combined = loaders if isinstance(loaders, CombinedLoader) else CombinedLoader(loaders, "max_size_cycle")
    if combined.mode == "sequential":
        raise ConfigError(
            'training does not support CombinedLoader(mode="sequential"); use "max_size_cycle" (the default), '
            '"min_size" or "max_size".'
        )
    combined.flattened = [prepare(dl) for dl in combined.flattened]
    combined.limits = [num_batches(dl, limit) for dl in combined.flattened]
    return combined


def flatten_eval(loaders: Any, phase: str) -> list[Any]:
    """Evaluation loaders as a flat list (a dict's values in order, nested collections flattened), each one a
    dataloader_idx; a CombinedLoader in another mode than "sequential" is one loader of combined batches."""
    if isinstance(loaders, CombinedLoader):
        if loaders.mode != "sequential":
            if phase == "predict":
                raise ConfigError('predict() only supports CombinedLoader(mode="sequential").')
            return [loaders]
        return list(loaders.flattened)
    return list(CombinedLoader(loaders, "sequential").flattened)


def one_loader(evals: Any) -> bool:
    """Evaluation data that is one loader: not a list or tuple, or one holding only numbers and strings (as
    Lightning, `trainer.test(task, [0])` is one loader of one batch, not a loader per element)."""
    return not isinstance(evals, (list, tuple)) or (len(evals) > 0 and _is_leaf(evals))


def eval_list(evals: Any, phase: str) -> list[Any]:
    """The evaluation loaders given to validate/test/predict (or returned by `<phase>_dataloader`) as a list, one
    per dataloader_idx: a collection flattened (a list of iterables gives its elements), one loader as itself, an
    empty list or tuple as none."""
    if is_collection(evals):
        return flatten_eval(evals, phase)
    return [evals] if one_loader(evals) else []


def prepare_eval(combined: CombinedLoader, prepare: Callable[[Any], Any], limit: int | float) -> int | float:
    """A non-sequential evaluation CombinedLoader: its inner loaders prepared and limited; returns its batches."""
    combined.flattened = [prepare(dl) for dl in combined.flattened]
    combined.limits = [num_batches(dl, limit) for dl in combined.flattened]
    return combined.num_batches()


def batches(loader: Any) -> Any:
    """What a loop iterates: the loader itself, or a CombinedLoader's batches without their indices."""
    if isinstance(loader, CombinedLoader):
        return _current(iter(loader))
    return loader


def _current(loader: CombinedLoader) -> Iterator[Any]:
    """The batches of the pass `loader` is in (iterating it again would start a new one)."""
    while True:
        try:
            batch, _, _ = next(loader)
        except StopIteration:
            return
        yield batch


def epoch_iterator(loader: CombinedLoader, state: LoopState, skip: int) -> Iterator[Any]:
    """This epoch's combined batches, starting after the first `skip` (a resume). The epoch's random draws are
    replayed from its starting RNG: each inner loader is started as it was, one that "max_size_cycle" started
    again is started again from the RNG snapshot of that moment, and each skips the batches it had drawn
    (indices only, in its batch sampler). Without a recorded position, the consumed batches are read and dropped."""
    position = state.resume_combined
    state.resume_combined = None
    own = load_loader_states(loader, state.resume_loader_states) if skip else set()
    state.resume_loader_states = None
    if not skip or position is None or len(position["drawn"]) != len(loader.flattened):
        it = iter(loader)
        state.combined = it._iterator
        out = _current(it)
        for _ in islice(out, skip):
            pass
        return out  # type: ignore[no-any-return]
    assert state.epoch_start_rng is not None
    set_rng_state(state.epoch_start_rng)
    restarted, drawn = position["restart_rngs"], position["drawn"]
    flat = loader.flattened
    started = [
        (iter(dl), _nothing) if i in own  # a stateful loader continues from its own state
        else (iter(dl), None) if restarted[i] is not None
        else _skipping(dl, drawn[i])
        for i, dl in enumerate(flat)
    ]  # fmt: skip
    for it, prime in started:  # the epoch's first draws, in the order its first batch made them
        if prime is None:  # (a loader cycled since: its first iterator's draws only)
            next(it, None)
        else:
            prime()
    iterators = [it for it, _ in started]
    for i, rng in enumerate(restarted):  # cycled loaders: started again as they were
        if rng is not None and i not in own:
            set_rng_state(rng)
            iterators[i], prime = _skipping(flat[i], drawn[i])
            prime()
    walk = _Walk(loader.mode, flat, loader.limits, iterators)
    walk.restart_rngs, walk.drawn = list(restarted), list(drawn)
    walk.exhausted = [rng is not None or d >= sized_len(dl) for rng, d, dl in zip(restarted, drawn, flat)]
    walk.idx = walk.total = skip
    loader._iterator = walk
    state.combined = walk
    return _current(loader)


def load_loader_states(loader: Any, states: list[Any] | None) -> set[int]:
    """Give the stateful loaders their saved states; returns the flat indices of the loaders restored so (they
    continue by themselves: nothing is replayed or skipped for them)."""
    flat = loader.flattened if isinstance(loader, CombinedLoader) else [loader]
    restored = {i for i, dl in enumerate(flat) if stateful(dl)}
    if not states:
        return set()
    if len(states) != len(restored):
        raise CheckpointError(
            f"the checkpoint holds the states of {len(states)} stateful training loaders, this run has "
            f"{len(restored)}: pass the loaders the checkpoint was written with."
        )
    for i, state in zip(sorted(restored), states):
        flat[i].load_state_dict(state)
    return restored


def _nothing() -> None:
    pass


def _skipping(loader: Any, skip: int) -> tuple[Iterator[Any], Callable[[], None]]:
    """An iterator over `loader` past its first `skip` batches and `prime()`, which makes its sampler's draw."""
    if rebuildable(loader) and loader.batch_sampler is not None:
        sampler = SkipBatchSampler(loader.batch_sampler, skip)
        return iter(rebuild(loader, batch_sampler=sampler)), sampler.prime
    it = iter(loader)

    def drop() -> None:  # iterable data sets cannot skip by index: read and drop
        for _ in islice(it, skip):
            pass

    return it, drop
