"""grad_norm: each parameter's gradient norm and their total, for ``self.log_dict(grad_norm(self, norm_type=2))``."""

from __future__ import annotations

import torch


def grad_norm(
    module: torch.nn.Module, norm_type: float | int | str, group_separator: str = "/"
) -> dict[str, torch.Tensor]:
    """The p-norm of every parameter's gradient, keyed ``grad_{p}_norm{sep}{name}``, and the norm of all of them
    as one vector under ``grad_{p}_norm_total`` (Lightning's keys); `norm_type` may be "inf". Parameters without
    a gradient are left out (and with none at all, the dict is empty)."""
    p = float(norm_type)
    if p <= 0:
        raise ValueError(f"`norm_type` must be a positive number or 'inf' (infinity norm). Got {p}")
    norms = {
        f"grad_{p}_norm{group_separator}{name}": param.grad.detach().norm(p)
        for name, param in module.named_parameters()
        if param.grad is not None
    }
    if norms:
        norms[f"grad_{p}_norm_total"] = torch.stack([v.float().cpu() for v in norms.values()]).norm(p)
    return norms
