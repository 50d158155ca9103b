"""The Lightning 2.6 compatibility table of docs/porting.md, generated from the code: every Trainer option with
every value Lightning accepts for it, every logger class and every strategy name, each with Tandem's answer
(Y, an alias, or the refusal's own message), found by asking the code itself.

    python -m trainer.porting            # print the table
    python -m trainer.porting --write    # replace it in docs/porting.md (tests/test_porting_table.py checks it)
"""

from __future__ import annotations

import inspect
import os
import sys
from datetime import timedelta
from typing import Any

START, END = "<!-- porting-table:start -->", "<!-- porting-table:end -->"
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "porting.md")

#: every option of Lightning 2.6's Trainer with values it accepts (its signature's forms; tests compare the names)
LIGHTNING_VALUES: dict[str, list[Any]] = {
    "accelerator": ["auto", "cpu", "cuda", "gpu", "mps", "tpu", "hpu", "xla"],
    "strategy": ["auto", "(every name in the strategy table below)"],
    "devices": ["auto", 1, "1", 2, "2", -1, "-1", "0,1", [0], [0, 1]],
    "num_nodes": [1, 2],
    "precision": [
        None,
        16,
        32,
        64,
        "16",
        "32",
        "64",
        "bf16",
        "16-mixed",
        "bf16-mixed",
        "16-true",
        "bf16-true",
        "32-true",
        "64-true",
        "transformer-engine",
        "transformer-engine-float16",
    ],  # fmt: skip
    "logger": [None, True, False],
    "callbacks": [None, []],
    "fast_dev_run": [False, True, 7],
    "max_epochs": [None, -1, 10],
    "min_epochs": [None, 2],
    "max_steps": [-1, 100],
    "min_steps": [None, 10],
    "max_time": [None, "00:12:00:00", {"hours": 1}, timedelta(minutes=5)],
    "limit_train_batches": [None, 1.0, 0.25, 10, 0, 5.0],
    "limit_val_batches": [None, 1.0, 0.25, 10, 0, 5.0],
    "limit_test_batches": [None, 1.0, 0.25, 10, 5.0],
    "limit_predict_batches": [None, 1.0, 0.25, 10, 5.0],
    "overfit_batches": [0.0, 0.1, 10, 5.0],
    "val_check_interval": [
        None,
        1.0,
        0.25,
        0.0,
        100,
        100.0,
        "00:00:00:30",
        {"seconds": 30},
        timedelta(seconds=30),
    ],
    "check_val_every_n_epoch": [1, 3, None],
    "num_sanity_val_steps": [None, 2, 0, -1],
    "log_every_n_steps": [None, 50, 1, 0],
    "enable_checkpointing": [None, True, False],
    "enable_progress_bar": [None, True, False],
    "enable_model_summary": [None, True, False],
    "accumulate_grad_batches": [1, 4],
    "gradient_clip_val": [None, 0.5, 1],
    "gradient_clip_algorithm": [None, "norm", "value"],
    "deterministic": [None, True, False, "warn"],
    "benchmark": [None, True, False],
    "inference_mode": [True, False],
    "use_distributed_sampler": [True, False],
    "profiler": [None, "simple", "advanced", "pytorch", "xla"],
    "detect_anomaly": [False, True],
    "barebones": [False, True],
    "plugins": [None],
    "sync_batchnorm": [False, True],
    "reload_dataloaders_every_n_epochs": [0, 2],
    "default_root_dir": [None, "runs"],
    "enable_autolog_hparams": [True, False],
    "model_registry": [None, "my-model"],
}
#: the names of Lightning 2.6's StrategyRegistry (tests compare them with the registry)
LIGHTNING_STRATEGIES = (
    "ddp", "ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true", "ddp_fork",
    "ddp_fork_find_unused_parameters_false", "ddp_fork_find_unused_parameters_true", "ddp_notebook",
    "ddp_notebook_find_unused_parameters_false", "ddp_notebook_find_unused_parameters_true", "ddp_spawn",
    "ddp_spawn_find_unused_parameters_false", "ddp_spawn_find_unused_parameters_true", "deepspeed",
    "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
    "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme", "fsdp", "fsdp_cpu_offload",
    "single_device", "single_tpu", "single_xla", "xla", "xla_debug",
)  # fmt: skip
#: the names Tandem's own documentation uses (the others of STRATEGIES are Lightning's aliases)
TANDEM_STRATEGIES = (
    "single",
    "dp",
    "ddp",
    "ddp_accumulate",
    "ddp_zero1",
    "fsdp",
    "model_parallel",
    "pipeline",
)
#: what a probe of TrainerConfig alone cannot show
NOTES = {
    "devices": "read against the machine when the Trainer is built (trainer/devices.py): on the CPU a count "
    "only, as Lightning; on CUDA indices that exist and are 0..n-1",
}
#: the logger classes of lightning.pytorch.loggers 2.6
LIGHTNING_LOGGERS = (
    "Logger", "TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger", "CometLogger", "NeptuneLogger",
    "LitLogger",
)  # fmt: skip


def _cell(text: str) -> str:
    return " ".join(str(text).replace("|", "\\|").split())


def _show(value: Any) -> str:
    if isinstance(value, timedelta):
        return f"timedelta(seconds={int(value.total_seconds())})"
    return repr(value)


def option_answer(name: str, value: Any) -> str | None:
    """None when TrainerConfig takes `value` for option `name`, else its error message."""
    from tandem_core.errors import ConfigError
    from trainer.options import TrainerConfig

    try:
        TrainerConfig.from_kwargs(**{name: value})
    except ConfigError as e:
        return str(e)
    return None


def options_table() -> list[str]:
    from trainer.options import NONE_IS_DEFAULT, TrainerConfig

    fields = TrainerConfig.__dataclass_fields__
    rows = ["| option | values (Lightning 2.6) | Tandem |", "|---|---|---|"]
    for name, values in LIGHTNING_VALUES.items():
        if name == "strategy":
            rows.append(f"| `{name}` | names, a Strategy instance | Y: the strategy table below |")
            continue
        refused = [(v, option_answer(name, v)) for v in values]
        status = "Y" if name in fields else "missing"
        if name in NONE_IS_DEFAULT:
            status += f" (None: {fields[name].default!r})"
        if name in NOTES:
            status += f" ({NOTES[name]})"
        no = [f"`{_show(v)}`: {msg}" for v, msg in refused if msg is not None]
        if no:
            status += "; refused: " + "; ".join(no)
        shown = ", ".join(f"`{_show(v)}`" for v in values)
        rows.append(f"| `{name}` | {_cell(shown)} | {_cell(status)} |")
    for name in TrainerConfig.names():
        if name not in LIGHTNING_VALUES:
            rows.append(f"| `{name}` | (Tandem only) | {_cell(fields[name].metadata['doc'])} |")
    return rows


def strategy_answer(name: str) -> tuple[str, str]:
    """(status, detail) for a strategy name: Y (a Tandem name), alias (a Lightning name Tandem maps to one of
    its strategies), or refused with the message Tandem gives."""
    from strategies import REFUSED, STRATEGIES, _load
    from tandem_core.errors import ConfigError

    if name in REFUSED:
        return "refused", REFUSED[name]
    if name not in STRATEGIES:
        return "missing", f"unknown strategy {name!r}"
    target, kwargs = STRATEGIES[name]
    try:
        cls, kwargs = _load(name)
        cls(**kwargs)
    except ConfigError as e:
        return "refused", str(e)
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    built = f"{target.rpartition(':')[2]}({args})"
    return ("Y" if name in TANDEM_STRATEGIES else "alias"), built


def strategies_table() -> list[str]:
    from strategies import STRATEGIES

    rows = ["| strategy name | Tandem | what it builds, or the message |", "|---|---|---|"]
    rows.append("| `auto` | Y | `single` on one device, else `ddp` |")
    names = list(LIGHTNING_STRATEGIES) + [n for n in STRATEGIES if n not in LIGHTNING_STRATEGIES]
    for name in names:
        status, detail = strategy_answer(name)
        tag = "" if name in LIGHTNING_STRATEGIES else " (Tandem only)"
        rows.append(f"| `{name}`{tag} | {status} | {_cell(detail)} |")
    return rows


def loggers_table() -> list[str]:
    import trainer.loggers as loggers

    rows = ["| logger | Tandem | constructor |", "|---|---|---|"]
    names = list(LIGHTNING_LOGGERS) + sorted(
        n for n in getattr(loggers, "__all__", []) if n.endswith("Logger") and n not in LIGHTNING_LOGGERS
    )
    for name in names:
        cls = getattr(loggers, name, None)
        if getattr(cls, "refused_because", ""):  # importable, refused when built (trainer/loggers/refused.py)
            rows.append(f"| `{name}` | refused when built | {_cell(cls.refused_because)} |")
            continue
        if not isinstance(cls, type):
            rows.append(
                f"| `{name}` | not in Tandem | `from trainer.loggers import {name}` is an ImportError |"
            )
            continue
        doc = (inspect.getdoc(cls) or "").split("\n\n")[0]  # the first paragraph
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        sig = ", ".join(
            f"**{p.name}" if p.kind is p.VAR_KEYWORD else f"{p.name}={p.default!r}" for p in params
        )
        rows.append(f"| `{name}` | Y | `{name}({_cell(sig)})`: {_cell(doc)} |")
    return rows


def table() -> str:
    """The whole generated section (between the markers in docs/porting.md)."""
    parts = [
        "Generated by `python -m trainer.porting --write` from the code (each value is given to Tandem and its "
        "answer recorded); `tests/test_porting_table.py` checks that this copy is current.",
        "",
        "### Trainer options",
        "",
        *options_table(),
        "",
        "### Strategy names",
        "",
        *strategies_table(),
        "",
        "### Loggers",
        "",
        *loggers_table(),
    ]
    return "\n".join(parts)


def documented(path: str = DOC) -> str:
    """The section between the markers in docs/porting.md, as it is now."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def write(path: str = DOC) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{START}\n{table()}\n{END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(table())
