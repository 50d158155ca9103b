"""The Strategy contract: where the task runs and how its gradients are combined.

The loop drives every strategy through these members only (17): `name`, `root_device`, `precision`,
`comm`, `launch`, `setup`, `compile`, `teardown`, `process_dataloader`, `batch_to_device`, `step`,
`autocast`, `backward`, `unscale_gradients`, `optimizer_step`, `state_dict`, `load_state_dict`. Rank information and
collectives live on `comm` (strategies/comm.py). Before setup, `tensor_init_context` (Lightning's) says where
and how a model is built (``Trainer.init_module``, ``configure_model``). A strategy is fully configured by its constructor; the
Trainer only fills what the constructor left unset (`None`), see strategies/__init__.py.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from strategies.batch import move_to_device, mover
from strategies.comm import Comm
from strategies.large.init import has_meta, init_context, materialize, misplaced
from strategies.large.weights import covered, load_pending
from strategies.precision import Precision
from tandem_core.errors import ConfigError
from tandem_core.hooks import default

if TYPE_CHECKING:
    from strategies.checkpoint.io import CheckpointIO
    from strategies.fork import ForkStart
    from trainer.task.base import Task


class Strategy:
    """Base class for device placement, data sampling, precision and gradient reduction.

    Example::

        class MyStrategy(Strategy):
            name = "mine"
            def setup(self, task): ...
    """

    name = "base"
    #: how the strategy starts its processes (Lightning's `strategy.launcher`): None where it starts none
    launcher: Any = None

    def on_exception(self, exception: BaseException) -> None:
        """Called when a stage fails (after the callbacks' and the DataModule's on_exception; Lightning's hook)."""

    def __init__(
        self,
        accelerator: str | None = None,
        precision: Precision | str | int | None = None,
        *,
        precision_plugin: Precision | None = None,
        checkpoint_io: Any = None,
    ) -> None:
        from strategies.accelerators import by_name

        self.accelerator = by_name(accelerator)  # None: the Trainer's (an Accelerator object: its name)
        if precision is not None and precision_plugin is not None:
            raise ConfigError(
                f"{type(self).__name__}(precision=..., precision_plugin=...): give the precision once (the plugin "
                "is Lightning's keyword for it)"
            )
        precision = precision_plugin if precision_plugin is not None else precision
        self._precision = None if precision is None else self._precision_plugin(precision)
        if checkpoint_io is not None:  # Lightning's keyword (strategies/plugins.py: the CheckpointIO kind)
            self.checkpoint_io, self._checkpoint_io_given = checkpoint_io, True
        self._root_device: torch.device | None = None  # chosen on first use, from the accelerator
        self.use_distributed_sampler = True
        self._overfit_batches: int | float = 0  # (set by resolve_strategy) samplers do not shuffle then
        self.comm: Comm = Comm()

    # ----- where we are -------------------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        """The device this process computes on."""
        if self._root_device is None:
            self._root_device = pick_device(self.accelerator or "auto")
        return self._root_device

    @property
    def precision(self) -> Precision:
        """The precision plugin (autocast, loss scaling, parameter dtype)."""
        if self._precision is None:
            self._precision = self._precision_plugin("32-true")
        return self._precision

    @property
    def precision_plugin(self) -> Precision:
        """Lightning's name for `precision` (the precision plugin); settable before setup."""
        return self.precision

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision) -> None:
        self._precision = plugin

    @property
    def lightning_module(self) -> Task | None:
        """The task this strategy was connected to (Lightning's name), None before."""
        return getattr(self, "_connected", None)

    # ----- life cycle ---------------------------------------------------------------------------
    def connect(self, task: Task) -> None:
        """Attach `task` to this strategy (Lightning's `Strategy.connect(model)`); the Trainer calls it when a
        stage starts, before `setup`."""
        self._connected = task

    def launch(self) -> ForkStart | None:
        """Bring this process into the job: join its process group, or start the workers (then the parent
        exits with their status and never returns), or return a ForkStart that runs the stage in forked
        workers (a notebook). One process: pick the device."""

    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        """Lightning's: tensors made inside (``Trainer.init_module``, ``configure_model``) go to root_device in
        the precision's parameter dtype (the "true" precisions); `empty_init=True` leaves them uninitialized.
        The sharding strategies put them on the meta device instead (strategies/large/init.py)."""
        dtype = (self._precision or self.precision).param_dtype
        return init_context(self.root_device, dtype, bool(empty_init))

    def setup(self, task: Task) -> None:
        """Move the task to the root device in the parameter dtype of the precision; what was built on the
        meta device is materialized there first (each module's reset_parameters, or weights waiting on it)."""
        precision = self.precision
        precision.setup(self.root_device)
        if has_meta(task):
            materialize(task, self.root_device, covered(task))
        if misplaced(task, self.root_device, None):
            task.to(device=self.root_device)
        if precision.convert_module(task) is not task:  # Lightning's hook; the Trainer holds this task
            raise ConfigError(
                f"{type(precision).__name__}.convert_module must convert the module in place and return it "
                "(Tandem trains the task object you passed); return `module.to(...)`, not a new module"
            )
        load_pending(task, sharded=False, reader=True)

    def compile(self, task: Task, apply: Callable[[Task], Callable[[], None]]) -> Callable[[], None]:
        """Compile the set-up task in place (after it was moved, wrapped or sharded) with `apply`
        (trainer/compiler.py); returns what gives it back uncompiled."""
        return apply(task)

    def teardown(self) -> None:
        """Release what setup acquired."""

    # ----- data ---------------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Adapt a loader to this strategy (distributed strategies inject a sampler)."""
        return loader

    def batch_to_device(self, batch: Any) -> Any:
        """`batch` (tensors in any nesting of lists, tuples, dicts, dataclasses) on root_device."""
        return move_to_device(batch, self.root_device, (self._precision or self.precision).param_dtype)

    # ----- steps --------------------------------------------------------------------------------
    def step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        """Run training_step, validation_step, test_step or predict_step (`hook`); dataloader_idx is passed
        (even 0) only when there are several loaders, as in Lightning."""
        return call_step(getattr(task, hook), batch, batch_idx, dataloader_idx)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for the forward pass under this precision."""
        return (self._precision or self.precision).autocast()  # (the property only before setup)

    def backward(
        self, loss: torch.Tensor, sync: bool = True, run: Callable[[torch.Tensor], Any] | None = None
    ) -> None:
        """Backward of `loss` (scaled under 16-mixed), through `run(scaled_loss)` when given (a task's own
        backward). With sync=False the gradients only accumulate locally (micro-batches 1..k-1 of an
        accumulation window): nothing is communicated."""
        scaled = (self._precision or self.precision).scale(loss)
        scaled.backward() if run is None else run(scaled)  # noqa: B018 (a call, not an expression)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the gradients final for the step: reduced across ranks and at their true scale."""
        (self._precision or self.precision).unscale(optimizer)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any
    ) -> Any:
        """Step (under 16-mixed the scaler skips a step whose gradients are inf/nan); `kwargs` go to the
        optimizer's own ``step`` (Lightning's ``opt.step(closure=..., **kwargs)`` in manual optimization)."""
        return (self._precision or self.precision).optimizer_step(optimizer, None, closure, **kwargs)

    # ----- checkpoints --------------------------------------------------------------------------
    @property
    def checkpoint_io(self) -> CheckpointIO:
        """Lightning's checkpoint-IO plugin: how this strategy's checkpoints are written and read (its own
        form, TorchCheckpointIO by default, or what was assigned here or passed in Trainer(plugins=[...]);
        strategies/checkpoint/plugins.py)."""
        from strategies.checkpoint.io import plugin_of

        return plugin_of(self)

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO) -> None:
        from strategies.checkpoint.plugins import attach

        attach(self, io)

    def state_dict(self) -> dict[str, Any]:
        """The strategy's own state for a checkpoint (e.g. the precision's loss scaler)."""
        return {"precision": self.precision.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""
        self.precision.load_state_dict(state.get("precision", {}))

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Whether a resume restores the optimizers' states (Lightning's switch; a subclass that restores them
        itself returns False). The schedulers' states are restored either way."""
        return True

    @default
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """A resume's optimizer states (Lightning's hook). By default the checkpoint-IO plugin loads them in the
        strategy's own form (sharded states included); a subclass that defines this loads them its own way."""

    def _own_checkpoint_io(self, form: Any) -> None:
        """A strategy that writes its checkpoints its own way (sharded states, gathered files) sets its `form`;
        a checkpoint_io given to its constructor joins it as an assignment would (strategies/checkpoint/plugins.py:
        AsyncCheckpointIO writes the form in the background; a CheckpointIO that cannot write it is refused)."""
        from strategies.checkpoint.plugins import use_form

        own = self.__dict__
        given = (
            own.get("_checkpoint_io") or own.get("_checkpoint_form")
            if own.get("_checkpoint_io_given")
            else None
        )
        use_form(self, form)
        if given is not None:
            self.checkpoint_io = given

    # ----- filled in by the Trainer (strategies/__init__.py), never after setup --------------------
    def _precision_plugin(self, precision: Precision | str | int) -> Precision:
        """The plugin for a precision name (Lightning's class for it; FSDPStrategy's is FSDPPrecision)."""
        from strategies.precision_plugins import plugin_for

        return precision if isinstance(precision, Precision) else plugin_for(precision)

    def _fill(self, name: str, value: Any, given: bool) -> None:
        """Take the Trainer's `value` for option `name` where the constructor left it unset; a value the
        user gave to both that differs is a ConfigError naming both."""
        attr = "_precision" if name == "precision" else name
        if name == "precision":
            value = self._precision_plugin(value)
        own = getattr(self, attr)
        if own is None:
            setattr(self, attr, value)
        elif given and not _same(name, own, value):
            raise ConfigError(
                f"{type(self).__name__}({name}={_show(own)}) conflicts with Trainer({name}={_show(value)}); "
                f"set {name} in one place only."
            )


# ----- derived from the contract, for the training loop's hot path (looked up once per epoch) ----------
def batch_mover(strategy: Strategy) -> Callable[[Any], Any]:
    """`move(batch)`: the strategy's batch_to_device, its device and dtype looked up once."""
    precision = strategy.precision
    if type(strategy).batch_to_device is not Strategy.batch_to_device:  # a subclass moves its own way
        move = strategy.batch_to_device
    else:
        move = mover(strategy.root_device, precision.param_dtype)
    if type(precision).convert_input is Precision.convert_input:  # (the mover casts to param_dtype)
        return move
    return lambda batch: precision.convert_input(move(batch))  # a precision plugin's own conversion


def step_runner(strategy: Strategy, task: Task, hook: str) -> Callable[[Any, int], Any]:
    """`run(batch, batch_idx)`: `hook` (training_step) under autocast, as the strategy's `step` runs it: its
    signature read once, and no context entered when autocast does nothing."""
    if type(strategy).step is not Strategy.step or type(strategy).autocast is not Strategy.autocast:

        def run(batch: Any, batch_idx: int) -> Any:  # a subclass steps its own way
            with strategy.autocast():
                return strategy.step(task, hook, batch, batch_idx)

        return run
    fn = getattr(task, hook)
    call = fn if _positional_count(getattr(fn, "__func__", fn)) >= 2 else lambda batch, _: fn(batch)
    precision = strategy.precision
    if not precision.casts:
        return call

    def cast(batch: Any, batch_idx: int) -> Any:
        with precision.autocast():
            return call(batch, batch_idx)

    return cast


def is_plain(strategy: Strategy) -> bool:
    """Whether the strategy's backward, unscale_gradients and optimizer_step are no more than torch's own
    `loss.backward()`, nothing, and `optimizer.step(closure)`: Strategy's methods, in a precision without a
    scaler. The training loop then calls torch directly."""
    cls = type(strategy)
    precision = strategy.precision
    return (precision.scaler is None and type(precision).optimizer_step is Precision.optimizer_step) and all(
        getattr(cls, name) is getattr(Strategy, name)
        for name in ("backward", "unscale_gradients", "optimizer_step")
    )


def call_step(fn: Callable[..., Any], batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> Any:
    """Call a *_step method with the arguments its signature takes: Lightning allows
    ``training_step(self, batch)`` without batch_idx, and passes dataloader_idx only with several loaders."""
    takes = _positional_count(getattr(fn, "__func__", fn))
    if dataloader_idx is not None and takes >= 3:
        return fn(batch, batch_idx, dataloader_idx)
    return fn(batch, batch_idx) if takes >= 2 else fn(batch)


_COUNTS: weakref.WeakKeyDictionary[Callable[..., Any], int] = weakref.WeakKeyDictionary()


def _positional_count(fn: Callable[..., Any]) -> int:
    """How many positional arguments (after self) `fn` accepts; *args counts as many. Cached weakly:
    FSDP replaces the step methods with per-task closures, which a strong cache would keep (and with
    them the task, its Trainer and the process group) for the life of the process."""
    try:
        count = _COUNTS.get(fn)
        if count is None:
            count = _COUNTS[fn] = _count_positional(fn)
    except TypeError:  # a callable that takes no weak reference: not cached
        count = _count_positional(fn)
    return count


def _count_positional(fn: Callable[..., Any]) -> int:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 3
    if params and params[0].name == "self":
        params = params[1:]
    if any(
        p.name == "dataloader_iter" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
    ):
        return 1  # the dataloader_iter flavor (Lightning's): the step gets the iterator alone
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 3
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _same(name: str, own: Any, value: Any) -> bool:
    if isinstance(own, Precision):
        return own.name == value.name
    if name == "accelerator":  # "gpu" is Lightning's other name for "cuda"
        return {"gpu": "cuda"}.get(own, own) == {"gpu": "cuda"}.get(value, value)
    if name == "devices" and isinstance(own, (list, tuple)) and isinstance(value, int):
        return len(own) == value
    return own == value


def _show(value: Any) -> str:
    return repr(value.name) if isinstance(value, Precision) else repr(value)


def pick_device(accelerator: str = "auto", index: int = 0) -> torch.device:
    """Resolve 'auto' | 'cpu' | 'cuda' | 'gpu' | 'mps' to a torch.device, with a clear error if absent."""
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    acc = {"gpu": "mps" if mps else "cuda"}.get(accelerator, accelerator)  # Lightning's "gpu": MPS on a Mac
    if acc == "auto":
        acc = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    if acc == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "accelerator='cuda' was requested but no CUDA GPU is visible; use accelerator='cpu'."
        )
    if acc == "mps" and not mps:
        raise ConfigError("accelerator='mps' was requested but MPS is not available; use accelerator='cpu'.")
    if acc not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"unknown accelerator {accelerator!r} (valid: 'auto', 'cpu', 'cuda', 'gpu', 'mps')")
    return torch.device(acc, index) if acc == "cuda" else torch.device(acc)
