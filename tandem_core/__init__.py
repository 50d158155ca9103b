"""The bottom layer: what every package may import (errors, the hook declarations, atomic file writes, rank-zero
helpers, small views). It imports nothing of trainer, strategies or callbacks; see docs/concepts.md "Layers"."""

import os

# torch.cuda.is_available() and device_count() through NVML, which does not initialize CUDA: a parent process
# that only asked whether there is a GPU can still fork workers that use it (ddp_fork / ddp_notebook), as
# Lightning does at import. A value the user set is kept.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
