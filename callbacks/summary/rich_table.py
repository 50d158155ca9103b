"""RichModelSummary: ModelSummary's table drawn with `rich` (the optional extra ``tandem-trainer[rich]``)."""

from __future__ import annotations

from typing import Any

from callbacks.model_summary import ModelSummary
from callbacks.summary.table import human_count
from tandem_core.errors import require


class RichModelSummary(ModelSummary):
    """The model summary as a rich table; ``header_style`` (default "bold magenta") styles its header.

    Example: ``Trainer(callbacks=[RichModelSummary(max_depth=2)])``.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        require("rich", "RichModelSummary", "rich")
        super().__init__(max_depth, **summarize_kwargs)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        console = get_console()
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        right = {"Params", "FLOPs", "In sizes", "Out sizes"}
        for name, _ in summary_data:
            style = "dim" if name == " " else "white" if name in ("In sizes", "Out sizes") else None
            table.add_column(
                name, justify="right" if name in right else "left", style=style, no_wrap=name == "Name"
            )
        for row in zip(*(values for _, values in summary_data)):
            table.add_row(*row)
        console.print(table)
        grid = Table.grid(expand=True)
        grid.add_column()
        for label, value in (
            ("Trainable params", human_count(trainable_parameters)),
            ("Non-trainable params", human_count(total_parameters - trainable_parameters)),
            ("Total params", human_count(total_parameters)),
            ("Total estimated model params size (MB)", f"{model_size:,.3f}"),
            ("Modules in train mode", str(total_training_modes["train"])),
            ("Modules in eval mode", str(total_training_modes["eval"])),
            ("Total FLOPs", human_count(total_flops)),
        ):
            grid.add_row(f"[bold]{label}[/]: {value}")
        console.print(grid)
