"""The Flax models: the encoder layers of every family, the kernels they are built from, and
the shared pooling and head. Architecture only: nothing about devices.
"""
