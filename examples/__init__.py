"""Runnable examples; importable for tests and configs (``from examples.digits import DigitsTask``)."""
