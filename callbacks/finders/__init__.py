"""The Tuner's callbacks: LearningRateFinder and BatchSizeFinder (the work is in trainer/tuner/)."""
