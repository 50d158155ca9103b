"""strategies/syncbn.py: BatchNorm over the global batch on CPU equals BatchNorm of one process on all of it."""

from __future__ import annotations

import torch

from strategies.syncbn import GroupBatchNorm, convert_sync_batchnorm


def make() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.LazyLinear(1)
    )


def _half(rank, world_size):
    model = convert_sync_batchnorm(make(), torch.device("cpu"))
    torch.manual_seed(1)
    x = torch.randn(8, 3, 6, 6)
    model(x[rank * 4 : (rank + 1) * 4]).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:
        torch.distributed.all_reduce(g)
    return grads, model[1].running_mean.clone(), model[1].running_var.clone()


def test_group_batchnorm_matches_one_process_on_the_whole_batch(dist_run):
    reference = make()
    torch.manual_seed(1)
    reference(torch.randn(8, 3, 6, 6)).sum().backward()
    for grads, mean, var in dist_run(_half):
        for g, p in zip(grads, reference.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mean, reference[1].running_mean)
        torch.testing.assert_close(var, reference[1].running_var)


def test_conversion_keeps_weights_and_falls_back_on_one_process():
    model = make()
    model(torch.randn(2, 3, 6, 6))
    with torch.no_grad():
        model[1].weight.fill_(2.0)
    converted = convert_sync_batchnorm(model, torch.device("cpu"))
    assert isinstance(converted[1], GroupBatchNorm) and torch.equal(converted[1].weight, model[1].weight)
    x = torch.randn(4, 3, 6, 6)
    torch.testing.assert_close(converted(x), model(x))  # no process group: plain BatchNorm
