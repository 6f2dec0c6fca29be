"""Fixtures of the env hub tests: a real S3 protocol server (moto) on 127.0.0.1, file
hubs in tmp folders, and copies of the tiny ``counter`` env package to vary.

The S3 tests never skip: moto is part of the test dependencies, and under ``CI=true`` a
missing moto is an error, not a skip."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest
from _pkgs import make_pkg

PKG = Path(__file__).parent / "pkgs" / "counter"
BUCKET = "rockroll-hub"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """A moto S3 server on 127.0.0.1 that a test can stop and start again (same port,
    same data: moto keeps its state in the process, not in the server)."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self._cls = ThreadedMotoServer
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = None

    def start(self) -> None:
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


@pytest.fixture(scope="session")
def moto_s3():
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = MotoS3()
    server.start()
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    server.stop()


@pytest.fixture
def s3_hub(moto_s3):
    """A fresh prefix in the bucket; ROCKROLL_S3_ENDPOINT points at the server."""
    os.environ["ROCKROLL_S3_ENDPOINT"] = moto_s3.endpoint
    if moto_s3.server is None:  # a test stopped it and failed before restarting
        moto_s3.start()
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"


@pytest.fixture
def file_hub(tmp_path):
    return f"file://{tmp_path / 'hub'}"


@pytest.fixture(params=["file", "s3", "memory"])
def any_hub(request, tmp_path, moto_s3):
    if request.param == "file":
        return f"file://{tmp_path / 'hub'}"
    if request.param == "memory":
        return f"memory://hub-{uuid.uuid4().hex[:8]}"
    return request.getfixturevalue("s3_hub")


@pytest.fixture
def cache(tmp_path):
    """A local cache of its own (a second machine, as far as the hub can tell)."""
    from rockroll.envhub.cache import LocalCache

    return LocalCache(tmp_path / "home")


@pytest.fixture
def pkg(tmp_path):
    return lambda **kw: make_pkg(tmp_path / f"pkg-{uuid.uuid4().hex[:6]}", **kw)
