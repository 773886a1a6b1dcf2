"""pytest-benchmark set-up: 8 virtual CPU devices for JAX before its backend starts."""

from __future__ import annotations


def pytest_configure(config) -> None:
    try:
        import jax

        jax.config.update("jax_num_cpu_devices", 8)
    except (ImportError, RuntimeError):
        pass
