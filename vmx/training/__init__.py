"""Training: `train()` and `run_phases` (trainer.py), the loop (loop.py), the `Input` it
consumes (inputs.py), phases, the jitted step (step.py), partitioning (mesh + logical axis
rules), optimizers, initial checkpoints, GradCache, prefetch, preemption and metrics.
Checkpoints and MODEL_DIR: vmx/modeldir/."""
