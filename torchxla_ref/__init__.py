"""The reference: the same models, steps and loop in PyTorch with torch_xla, sharing the
framework-free `jaxtpu.core` (flags, data, loop, metrics) with the JAX side."""
