"""Memory of a training step, per rank: counted live (tracker.py, on real or fake tensors), measured from torch's
allocator or the kernel (measure.py), and predicted before launch without allocating (plan.py, simulate.py)."""
