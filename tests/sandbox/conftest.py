import os

import pytest

from rockroll.sandbox import SandboxSpec, open_sandbox


@pytest.fixture
def spec():
    return SandboxSpec(memory_mb=256, pids=128, cpus=1.0, timeout_s=30)


@pytest.fixture
def sb(spec):
    with open_sandbox(spec) as box:
        yield box


@pytest.fixture(scope="module")
def client():
    try:
        from rockroll.sandbox.deployment.docker import docker_client

        engine = docker_client()
        engine.ping()
    except Exception as e:  # noqa: BLE001 - any reason is a reason to skip (or fail in CI)
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the docker tests, but the Docker engine is unusable: {e}")
        pytest.skip(f"no usable Docker engine: {e}")
    yield engine
    # snapshot-chain images these tests made (cached per chain; a user keeps them)
    engine.images.prune(filters={"label": "rockroll.chain", "dangling": False})
    engine.close()


@pytest.fixture(scope="module")
def image(client):
    from rockroll.sandbox.deployment.images import ensure_docker_image

    return ensure_docker_image()  # minutes the first time, cached afterwards
