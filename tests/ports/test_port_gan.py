"""gan.py (manual optimization, two optimizers, toggle_optimizer, training_step without batch_idx) against a
hand-written loop with Lightning's documented semantics."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, differs, seed_all, weights

gan = LazyPort("gan")


def _requires_grad(module: torch.nn.Module, flag: bool) -> None:
    for p in module.parameters():
        p.requires_grad_(flag)


@functools.cache  # computed once per session; the tests only read it
def reference(epochs: int = 3, toggle: bool = True) -> dict[str, torch.Tensor]:
    """The GAN's semantics in plain PyTorch. toggle_optimizer(opt) turns off requires_grad of every parameter
    that belongs to another optimizer until untoggle_optimizer(opt); the module has no validation_step, so
    Lightning runs no validation loop (and never iterates the data module's val loader)."""
    seed_all(42)
    points = gan.ring_points(384)
    loader = DataLoader(TensorDataset(points[:320]), batch_size=64, shuffle=True)
    g, d = gan.Generator(4), gan.Discriminator()
    torch.randn(16, 4)  # GAN.__init__ draws its fixed validation_z here
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-3, betas=(0.5, 0.999))
    for _ in range(epochs):
        for (x,) in loader:
            z = torch.randn(x.shape[0], 4)
            valid, fake = torch.ones(x.shape[0], 1), torch.zeros(x.shape[0], 1)
            _requires_grad(d, not toggle)
            F.binary_cross_entropy_with_logits(d(g(z)), valid).backward()
            opt_g.step()
            opt_g.zero_grad()
            _requires_grad(d, True)
            _requires_grad(g, not toggle)
            real = F.binary_cross_entropy_with_logits(d(x), valid)
            fake_loss = F.binary_cross_entropy_with_logits(d(g(z).detach()), fake)
            ((real + fake_loss) / 2).backward()
            opt_d.step()
            opt_d.zero_grad()
            _requires_grad(g, True)
    return {
        **{f"generator.{k}": v for k, v in weights(g).items()},
        **{f"discriminator.{k}": v for k, v in weights(d).items()},
    }


def test_gan_ends_with_the_hand_loops_weights(tmp_path):
    out = gan.main(default_root_dir=str(tmp_path), **QUIET)
    assert_same_weights(weights(out["model"]), reference())


def test_toggle_optimizer_matters_for_this_script():
    # without toggling, the generator's backward leaves gradients on the discriminator that its own step
    # then adds to: a Trainer that ignored toggle_optimizer would end elsewhere (so the test above can fail)
    assert differs(reference(epochs=1), reference(epochs=1, toggle=False))


def test_gan_counts_every_optimizer_step_and_restores_requires_grad(tmp_path):
    out = gan.main(default_root_dir=str(tmp_path), **QUIET)
    # manual optimization: global_step counts every optimizer.step(), two per batch (5 batches, 3 epochs)
    assert out["trainer"].global_step == 2 * 5 * 3
    assert all(p.requires_grad for p in out["model"].parameters())  # untoggle_optimizer restored them
    assert "sample_radius" in out["trainer"].callback_metrics
