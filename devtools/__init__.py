"""What the tests and benchmarks use that measures nothing: the code-shape checker
(`codeshape`: layers, limits, the module map) and a Google Cloud Storage emulator
(`gcs_emulator`)."""
