"""Shared test set-up: float64 enabled for the references, fresh random seeds, GPU skipping."""

import jax
import numpy as np
import pytest

jax.config.update("jax_num_cpu_devices", 4)  # expert-parallel tests shard over CPU devices; set before backends start
jax.config.update("jax_enable_x64", True)  # for the float64 references; te_async is explicit about dtypes

from helpers import gpu_available  # noqa: E402  (after the config: helpers imports jax.numpy)


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and te_async's CUDA extension")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh generator per test; the seed is printed so that a failure can be replayed."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
