"""Preflight: whether a training run fits a target's devices and how fast it may run there,
before you rent it, compiled on this machine (`python -m jaxtpu.preflight`): the targets,
the lowering of a run's steps, the memory check and the batch search, the speed estimate, the
report and the command."""
