import pytest

from rockroll.sandbox import SandboxSpec, open_sandbox


@pytest.fixture
def spec():
    return SandboxSpec(memory_mb=256, pids=128, cpus=1.0, timeout_s=30)


@pytest.fixture
def sb(spec):
    with open_sandbox(spec) as box:
        yield box
