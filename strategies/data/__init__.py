"""DataLoaders as strategies see them: rebuilding one with another sampler, and which samples each batch holds."""
