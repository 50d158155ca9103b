"""The Tuner's callbacks: LearningRateFinder and BatchSizeFinder (the searches are in trainer/tuner/, reached
through the trainer they receive), and where a tuned value lives (attrs)."""
