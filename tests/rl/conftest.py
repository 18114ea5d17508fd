"""The tiny model of the RL step's tests, one per test module."""

import pytest

from tests.rl.update_world import tiny_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()
