"""Test helpers shared by several test files (models, data, reference runs): `helpers.<module>`."""
