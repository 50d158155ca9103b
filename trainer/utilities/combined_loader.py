"""CombinedLoader: several loaders (a dict, a list, nested) iterated together, in Lightning's four modes and with
Lightning's signature. Each step yields ``(batch, batch_idx, dataloader_idx)``; the batch has the collection's
shape (a dict of batches for a dict of loaders), except in "sequential" mode, which yields each loader's own
batches one loader after the other with its index."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

from torch.utils._pytree import tree_flatten, tree_unflatten

Mode = Literal["min_size", "max_size_cycle", "max_size", "sequential"]
MODES: dict[str, Any] = {"min_size": min, "max_size_cycle": max, "max_size": max, "sequential": sum}


def _is_leaf(node: Any) -> bool:
    """A loader, or a collection holding only numbers and strings (itself an iterable, as Lightning treats it)."""
    if isinstance(node, (list, tuple, dict)):
        children = list(node.values()) if isinstance(node, dict) else list(node)
        return all(isinstance(c, (int, float, str)) for c in children)
    return True


def sized_len(iterable: Any) -> int | float:
    """len(iterable), or inf for an iterable without one."""
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return float("inf")


class _Walk(Iterator[tuple[Any, int, int]]):
    """One pass over the flattened iterables in a mode. Tracks, per iterable, the batches drawn from its current
    iterator and, for one restarted by "max_size_cycle", the RNG snapshot taken just before the restart (what an
    exact mid-epoch resume replays: trainer/loop/data.py)."""

    def __init__(
        self,
        mode: str,
        iterables: list[Any],
        limits: list[int | float] | None,
        iterators: list[Any] | None = None,
    ) -> None:
        self.mode, self.iterables, self.limits = mode, iterables, limits
        n = len(iterables)
        self.idx, self.current = 0, 0  # batch_idx; the iterable "sequential" is reading
        self.exhausted = [False] * n
        self.restart_rngs: list[Any] = [None] * n
        self.drawn = [0] * n
        self.total = 0  # combined batches drawn
        self.stateful = [it for it in iterables if stateful(it)]
        self.before_last: tuple[list[Any], list[int], list[Any]] = self._now()
        if iterators is not None:  # started already (a resumed pass: trainer/loop/combined.py)
            self.iterators: list[Any] = iterators
        elif mode == "sequential":
            self.iterators = [iter(iterables[0])] if n else []
        else:
            self.iterators = [iter(it) for it in iterables]

    def _now(self) -> tuple[list[Any], list[int], list[Any]]:
        return list(self.restart_rngs), list(self.drawn), [it.state_dict() for it in self.stateful]

    def position(self, consumed: int) -> dict[str, Any]:
        """Where each iterable is after `consumed` combined batches (the last drawn one, or the one before: a
        loop reading one batch ahead): restart RNGs, batches drawn, the stateful iterables' states."""
        rngs, drawn, states = self._now() if consumed >= self.total else self.before_last
        return {"restart_rngs": rngs, "drawn": drawn, "states": states}

    def _next_of(self, i: int) -> Any:
        out = next(self.iterators[i])
        self.drawn[i] += 1
        return out

    def __next__(self) -> tuple[Any, int, int]:
        self.before_last = self._now()
        if self.mode == "sequential":
            return self._next_sequential()
        n, out = len(self.iterators), []
        if n == 0:
            raise StopIteration
        for i in range(n):
            try:
                out.append(self._next_of(i))
            except StopIteration:
                self.exhausted[i] = True
                if self.mode == "min_size" or (self.mode == "max_size_cycle" and all(self.exhausted)):
                    raise
                if self.mode == "max_size":
                    out.append(None)
                    continue
                from trainer.seed import get_rng_state  # (the snapshot an exact resume replays)

                self.restart_rngs[i], self.drawn[i] = get_rng_state(), 0
                self.iterators[i] = iter(self.iterables[i])
                out.append(self._next_of(i))
        if self.mode == "max_size" and all(x is None for x in out) and all(self.exhausted):
            raise StopIteration
        idx, self.idx, self.total = self.idx, self.idx + 1, self.total + 1
        return out, idx, 0

    def _next_sequential(self) -> tuple[Any, int, int]:
        while self.current < len(self.iterables):
            limit = self.limits[self.current] if self.limits is not None else float("inf")
            if self.idx < limit:
                try:
                    out = self._next_of(self.current)
                    idx, self.idx, self.total = self.idx, self.idx + 1, self.total + 1
                    return out, idx, self.current
                except StopIteration:
                    pass
            self.current, self.idx = self.current + 1, 0  # one loader at a time: start the next one only now
            self.iterators = [None] * self.current + (  # type: ignore[list-item]
                [iter(self.iterables[self.current])] if self.current < len(self.iterables) else []
            )
        raise StopIteration

    def __len__(self) -> int:
        return _length(self.mode, self.iterables, self.limits)


def _length(mode: str, iterables: list[Any], limits: list[int | float] | None) -> int:
    lengths = [sized_len(it) for it in iterables]
    if limits is not None:
        lengths = [min(n, lim) for n, lim in zip(lengths, limits)]
    if not lengths:
        return 0
    n = MODES[mode](lengths)
    if n == float("inf"):
        raise TypeError(
            f"CombinedLoader(mode={mode!r}) has no length: an iterable in it has none "
            f"(lengths {[sized_len(it) for it in iterables]})."
        )
    return int(n)


class CombinedLoader(Iterable[tuple[Any, int, int]]):
    """Iterate several iterables together (Lightning's class and modes). Example::

        loaders = {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}
        for batch, batch_idx, dataloader_idx in CombinedLoader(loaders, "max_size_cycle"):
            ...  # batch == {"a": tensor, "b": tensor}; "a" starts again after its 2 batches

    Modes: "min_size" (stop with the shortest), "max_size_cycle" (stop with the longest, the others start
    again; the Trainer's mode for training), "max_size" (stop with the longest, None for the exhausted),
    "sequential" (each iterable after the other, with its dataloader_idx; the mode for evaluation).
    """

    def __init__(self, iterables: Any, mode: Mode = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables, self._mode = iterables, mode
        self._flattened, self._spec = tree_flatten(iterables, is_leaf=_is_leaf)
        self._iterator: _Walk | None = None
        self._limits: list[int | float] | None = None

    @property
    def mode(self) -> str:
        """How the loaders combine: max_size_cycle, min_size, max_size or sequential."""
        return self._mode

    @property
    def iterables(self) -> Any:
        """The collection of iterables as given (rebuilt from `flattened` when that was set)."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list, in the collection's order (dataloader_idx in "sequential" mode)."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(
                f"Mismatch in flattened length ({len(flattened)}) and existing length ({len(self._flattened)})"
            )
        self._iterables, self._flattened = tree_unflatten(flattened, self._spec), list(flattened)

    @property
    def sampler(self) -> Any:
        """Each loader's sampler, in the collection's shape."""
        return tree_unflatten([getattr(x, "sampler", None) for x in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        """Each loader's batch sampler, in the collection's shape."""
        return tree_unflatten([getattr(x, "batch_sampler", None) for x in self._flattened], self._spec)

    @property
    def limits(self) -> list[int | float] | None:
        """Batches taken at most from each iterable (limit_*_batches), or None."""
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(
                f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(self._flattened)})"
            )
        self._limits = limits

    def num_batches(self) -> int | float:
        """The batches one pass yields under the limits (inf when an iterable without a length decides it)."""
        try:
            return _length(self._mode, self._flattened, self._limits)
        except TypeError:
            return float("inf")

    def __iter__(self) -> CombinedLoader:
        self._iterator = _Walk(self._mode, self._flattened, self._limits)
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        out, batch_idx, dataloader_idx = next(self._iterator)
        if self._mode == "sequential":
            return out, batch_idx, dataloader_idx
        return tree_unflatten(out, self._spec), batch_idx, dataloader_idx

    def __len__(self) -> int:
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        return len(self._iterator)

    def reset(self) -> None:
        """Forget the current pass (and shut down the workers of loaders that keep their iterator)."""
        self._iterator = None
        for loader in self._flattened:
            it = getattr(loader, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            if hasattr(loader, "_iterator"):
                loader._iterator = None

    def _state_dicts(self) -> list[dict[str, Any]]:
        """The state_dict() of every iterable that has state_dict and load_state_dict (Lightning's Stateful)."""
        return [it.state_dict() for it in self._flattened if stateful(it)]

    def _load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        if not states:
            return
        owners = [it for it in self._flattened if stateful(it)]
        if len(owners) != len(states):
            raise RuntimeError(
                f"The CombinedLoader has {len(owners)} stateful loaders, but found {len(states)} states in "
                "the checkpoint. Please make sure you define the same dataloaders that were used when saving "
                "the checkpoint."
            )
        for it, state in zip(owners, states):
            it.load_state_dict(state)


def stateful(obj: Any) -> bool:
    """Whether `obj` has state_dict and load_state_dict (Lightning's Stateful protocol)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
