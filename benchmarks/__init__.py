"""Measurements: step time of both sides on the same devices, epochs, data at scale, the TPU
estimates and tuning, and the shape of the code."""
