"""Minimal re-creation of data_modules/flowers102.py of github.com/Cogniveon/pytorch-template (commit
e116039d55f17a571508736b93985aabbdd7ef48): the same class name and __init__ arguments, on Tandem's DataModule,
with random 3x8x8 images and 102 classes in place of the Flowers102 download; loaders in this process
(num_workers is kept but not used: 7 workers per test on a 2-core machine)."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule


class Flowers102DataModule(DataModule):
    def __init__(self, data_dir: str, batch_size: int = 8, num_workers: int = 4):
        super().__init__()
        self.data_dir, self.batch_size, self.num_workers = data_dir, batch_size, num_workers

    def setup(self, stage: str):
        g = torch.Generator().manual_seed(0)
        self.train = TensorDataset(
            torch.randn(60, 3, 8, 8, generator=g), torch.randint(0, 102, (60,), generator=g)
        )
        self.val = TensorDataset(
            torch.randn(40, 3, 8, 8, generator=g), torch.randint(0, 102, (40,), generator=g)
        )

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)
