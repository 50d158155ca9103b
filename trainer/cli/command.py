"""The `tandem` command (also ``python -m trainer``): run any experiment from YAML.

    tandem fit --config examples/configs/digits.yaml trainer.strategy=ddp trainer.devices=2 task.lr=0.05
    tandem fit --config runs/digits/lightning_logs/version_0/config.yaml --ckpt-path last     # resume that run
    tandem validate --config examples/configs/digits.yaml --ckpt-path runs/.../last.ckpt
    tandem fit --config examples/configs/digits.yaml --print-config                 # show, do not run
    tandem plan --config examples/configs/digits.yaml trainer.strategy=fsdp trainer.devices=4   # memory per rank
    tandem fit --config lightning_cli.yaml --trainer.max_epochs=3 --model.lr 0.1   # LightningCLI's form
    tandem lighthouse --bind 10.0.0.1:29510 --min-replicas 1    # torchft's lighthouse (docs/fault-tolerance.md)

Options come from the config files (merged in order), then the ``key=value`` overrides, which win.
LightningCLI's ``--section.key=value`` and ``--section.key value`` are overrides too (docs/configuration.md).
A mistake in the config exits with status 2 and a one-line message (``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from tandem_core.errors import ConfigError, TandemError, check_choice
from trainer.secrets import redacted_errors

COMMANDS = ("fit", "validate", "test", "predict", "plan")
# LightningCLI's option form of an override: --trainer.max_epochs=3, --model.lr 0.1, --optimizer Adam
_OPTION = re.compile(
    r"--(seed_everything|trainer|model|data|optimizer|lr_scheduler|task|callbacks|logger)(\.[\w.]+)?(=.*)?$"
)
PRINT_FLAGS = ("skip_null",)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tandem",
        description="Run a Tandem experiment from YAML config files and key=value overrides.",
        epilog="Example: tandem fit --config examples/configs/digits.yaml trainer.max_epochs=3 task.lr=0.05. "
        "Sections and options: docs/configuration.md.",
    )
    p.add_argument(
        "command",
        nargs="?",
        metavar="{fit,validate,test,predict,plan}",
        help="what to run (plan: each rank's predicted peak memory in a training step; exit status 3 when it "
        "does not fit; 'tandem lighthouse -h': fault tolerance's lighthouse)",
    )
    p.add_argument(
        "-c",
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML config; repeat to merge several (later files win)",
    )
    p.add_argument(
        "--ckpt-path",
        "--ckpt_path",
        dest="ckpt_path",
        metavar="P",
        help="checkpoint to resume (fit) or to evaluate; 'last' is this experiment's newest last.ckpt",
    )
    p.add_argument(
        "--print-config",
        "--print_config",
        dest="print_config",
        action="store_true",
        help="print the resolved config as YAML and exit (--print_config=skip_null leaves out null values)",
    )
    p.add_argument("--debug", action="store_true", help="show the full traceback of configuration errors")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="e.g. trainer.max_epochs=3 task.lr=0.05 (or LightningCLI's --trainer.max_epochs=3, --model.lr 0.05)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `tandem` and `python -m trainer`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lighthouse"]:  # fault tolerance's lighthouse: options of its own
        from strategies.fault_tolerance.lighthouse import main as lighthouse

        return lighthouse(argv[1:])
    parser = _parser()
    try:
        argv, print_flags = lightning_options(argv)
    except ValueError as e:
        parser.error(str(e))
    args = parser.parse_intermixed_args(argv)
    args.print_flags = print_flags
    if args.command is None:
        parser.error("say what to run: fit, validate, test, predict or plan")
    _cwd_last()
    try:
        with redacted_errors():  # no environment value in clear in a message either (trainer/secrets.py)
            return _run(args)
    except TandemError as e:
        if args.debug:
            raise
        world = os.environ.get("WORLD_SIZE", "1")
        where = f" (rank {os.environ.get('RANK')})" if world.isdigit() and int(world) > 1 else ""
        print(f"tandem: error{where}: {e}", file=sys.stderr)
        cause = e.__cause__
        if cause is not None and type(cause).__module__.split(".")[0] not in ("trainer", "omegaconf", "yaml"):
            print("tandem: (run with --debug to see where it failed)", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        print("tandem: interrupted", file=sys.stderr)
        return 130


def lightning_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """LightningCLI's spellings -> Tandem's: ``--trainer.max_epochs=3`` and ``--model.lr 0.1`` become the
    overrides ``trainer.max_epochs=3`` and ``model.lr=0.1``; ``--print_config=skip_null`` gives its flags."""
    out, flags, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        flag, _, value = arg.partition("=")
        if flag in ("--print_config", "--print-config") and value:
            unknown = [f for f in value.split(",") if f not in PRINT_FLAGS]
            if unknown:
                raise ValueError(f"--print_config={value}: Tandem knows only {', '.join(PRINT_FLAGS)}")
            out.append(flag)
            flags += value.split(",")
        elif _OPTION.match(arg) and "=" in arg:
            out.append(arg[2:])
        elif _OPTION.match(arg):
            if i + 1 == len(argv):
                raise ValueError(f"{arg} needs a value: {arg}=VALUE or {arg} VALUE")
            out.append(f"{arg[2:]}={argv[i + 1]}")
            i += 1
        else:
            out.append(arg)
        i += 1
    return out, flags


def _cwd_last() -> None:
    """Put the working directory at the END of sys.path: _target_ may name this directory's modules, but a
    stray file there (an omegaconf.py, a torch.py) never shadows an installed package. `python -m` and
    `python -c` put it first; a console script does not put it at all."""
    cwd = os.getcwd()
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", cwd):
        sys.path.pop(0)  # the entry Python added for -m / -c; an explicit PYTHONPATH entry stays
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.append(cwd)


def _run(args: argparse.Namespace) -> int:
    from trainer import config
    from trainer.secrets import env_values

    check_choice("command", args.command, COMMANDS)
    if args.print_config:
        raw = config.load(args.config, args.overrides)  # environment values shown as ${oc.env:NAME}
        resolved = config.resolve(raw)
        shown = _skip_null(resolved) if "skip_null" in args.print_flags else resolved
        print(config.to_yaml(shown, env_values(raw)), end="")
        return 0
    if not args.config and not args.overrides:
        raise ConfigError(
            f"tandem {args.command} needs --config FILE (or key=value options); see tandem --help"
        )
    if args.command == "plan":  # rehearsed in this process, launching nothing (trainer/plan.py)
        from trainer.config.plan import plan_config

        plan = plan_config(args.config, args.overrides)
        print(plan.table())
        return 3 if plan.fits is False else 0
    run = config.build(args.config, args.overrides, with_task=False)
    if run.config["task"] is None:
        raise ConfigError("the config has no task section; add task: {_target_: your.module.YourTask, ...}")

    def body() -> Any:  # in this process, or in each worker a multi-process strategy starts
        config.build_task(run)
        method = getattr(run.trainer, args.command)
        ckpt_path = run.config["ckpt_path"] if args.ckpt_path is None else args.ckpt_path
        return method(run.task, datamodule=run.datamodule, ckpt_path=ckpt_path)

    # A launcher process (ddp with devices > 1) exits in launch() once its workers are done, so it never
    # builds the task or the data: each worker does. Inside body, fit() calls launch() again, which in a
    # worker (or a single process) only joins the group it already joined.
    run.trainer.strategy.launch()
    result = body()
    if run.trainer.is_global_zero:
        _report(args.command, result, run.trainer)
    return 0


def _skip_null(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _skip_null(v) for k, v in value.items() if v is not None}
    return [_skip_null(v) for v in value] if isinstance(value, list) else value


def _report(command: str, result: Any, trainer: Any) -> None:
    if command in ("validate", "test") and result:
        for i, metrics in enumerate(result):
            title = f"{command} results" + (f" (dataloader {i})" if len(result) > 1 else "")
            width = max([len(k) for k in metrics] + [len(title)])
            print(title)
            for key, value in sorted(metrics.items()):
                print(f"  {key:<{width}}  {value:.6g}")
    elif command == "predict":
        print(f"predict: {len(result or [])} batches of predictions")
    elif command == "fit":
        print(f"run directory: {trainer.log_dir}")


if __name__ == "__main__":
    sys.exit(main())
