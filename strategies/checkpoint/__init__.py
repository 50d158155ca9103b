"""The checkpoint's file forms, which a strategy chooses between: one file written by rank 0, or a directory of
every rank's shards (torch.distributed.checkpoint); how each is written, checked and safely read."""
