"""Training: loss, sharding (TorchRec DMP), the per-rank loop, checkpoints and the train/score stages."""
