"""The framework-free core, shared by both sides and free of jax and torch imports (tested):
the flags, the data, Hugging Face checkpoints, the run loop, and the task table, metrics,
schedules, errors and files beside them."""
