"""Hugging Face checkpoints: the family table, an encoder's configuration, and reading and
writing checkpoint directories and state dicts (framework-free).
"""
