"""Test helpers shared by several test files (models, data, reference runs); imported as `helpers.<module>`."""
