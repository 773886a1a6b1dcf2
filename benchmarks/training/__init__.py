"""Training speed and memory: step time of jaxtpu against torch_xla and plain PyTorch, an
epoch of real comments, data at Jigsaw scale, the TPU estimates and tuning, precisions,
checkpoints in a bucket, the default run and the accelerator check."""
