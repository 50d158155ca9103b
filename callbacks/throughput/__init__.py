"""Throughput: the rolling-rate meter with measure_flops (meter.py) and the ThroughputMonitor callback."""

from callbacks.throughput.meter import Throughput, get_available_flops, measure_flops

__all__ = ["Throughput", "get_available_flops", "measure_flops"]
