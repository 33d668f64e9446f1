"""``stapo train``: TRL's GRPOTrainer with the paper's objectives (trainer.py), token-budget micro-batches,
token diagnostics, per-step metrics and cost, the run directory (checkpoints, manifests, resume)."""
