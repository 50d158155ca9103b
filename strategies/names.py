"""The strategy names ``Trainer(strategy="name")``, config files and StrategyRegistry look up (Lightning's names,
aliases of Tandem's strategies), and Lightning's names that Tandem refuses with what to use instead."""

from __future__ import annotations

from typing import Any

# name -> ("module:Class", constructor arguments); imported on demand so that `import trainer` stays fast.
STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {
    "single": ("strategies.single:SingleDeviceStrategy", {}),
    "single_device": ("strategies.single:SingleDeviceStrategy", {}),  # Lightning's name
    "dp": ("strategies.data_parallel:DataParallelStrategy", {}),
    "ddp": ("strategies.ddp:DDPStrategy", {"start_method": "popen"}),
    "ddp_accumulate": ("strategies.ddp:DDPStrategy", {}),  # config alias: use with accumulate_grad_batches=k
    "ddp_find_unused_parameters_true": (
        "strategies.ddp:DDPStrategy",
        {"find_unused_parameters": True, "start_method": "popen"},
    ),
    "ddp_find_unused_parameters_false": (
        "strategies.ddp:DDPStrategy",
        {"find_unused_parameters": False, "start_method": "popen"},
    ),
    "ddp_zero1": ("strategies.ddp:DDPStrategy", {"zero": 1}),  # ZeRO-1: optimizer states sharded
    "pipeline": ("strategies.pipeline:PipelineStrategy", {}),
    "fsdp": ("strategies.fsdp:FSDPStrategy", {}),
    "fsdp_cpu_offload": ("strategies.fsdp:FSDPStrategy", {"cpu_offload": True}),
    "model_parallel": ("strategies.model_parallel:ModelParallelStrategy", {}),
}
# Lightning's DDP start methods: fork (notebooks) and spawn start the workers from this process (strategies/fork.py)
for _name, _method in (("fork", "fork"), ("notebook", "fork"), ("spawn", "spawn")):
    STRATEGIES[f"ddp_{_name}"] = ("strategies.ddp:DDPStrategy", {"start_method": _method})
    for _unused in (True, False):
        STRATEGIES[f"ddp_{_name}_find_unused_parameters_{str(_unused).lower()}"] = (
            "strategies.ddp:DDPStrategy",
            {"start_method": _method, "find_unused_parameters": _unused},
        )
#: the names whose workers are forked from this process (they need an OS that can fork)
FORK_NAMES = tuple(n for n, (_, kw) in STRATEGIES.items() if kw.get("start_method") == "fork")
_DEEPSPEED = (
    "DeepSpeed is not part of Tandem; use strategy='fsdp', which shards parameters, gradients and optimizer "
    "states as ZeRO stage 3 does ('fsdp_cpu_offload' or FSDPStrategy(cpu_offload=True) for the offload variants)"
)
_XLA = "TPUs/XLA are not supported by Tandem; run on CUDA or the CPU with strategy='ddp' (or 'single')"
#: Lightning's strategy names that Tandem refuses, with what to use instead
REFUSED: dict[str, str] = {
    **{
        name: f"strategy={name!r}: {_DEEPSPEED}"
        for name in (
            "deepspeed",
            "deepspeed_stage_1",
            "deepspeed_stage_2",
            "deepspeed_stage_2_offload",
            "deepspeed_stage_3",
            "deepspeed_stage_3_offload",
            "deepspeed_stage_3_offload_nvme",
        )
    },
    **{name: f"strategy={name!r}: {_XLA}" for name in ("single_tpu", "single_xla", "xla", "xla_debug")},
}
