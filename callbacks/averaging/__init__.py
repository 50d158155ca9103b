"""Weight averaging: StochasticWeightAveraging (epoch-wise SWA with SWALR) and WeightAveraging / EMAWeightAveraging."""
