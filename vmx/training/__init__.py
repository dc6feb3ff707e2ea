"""Training: partitioning (mesh + logical axis rules), optimizers, checkpoints, trainer."""
