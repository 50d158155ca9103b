"""The bottom layer: what every package may import (errors, the hook declarations, atomic file writes, rank-zero
helpers, small views). It imports nothing of trainer, strategies or callbacks; see docs/concepts.md "Layers"."""
