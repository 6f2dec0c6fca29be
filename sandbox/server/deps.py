"""What every route takes from the app it runs in (set once by ``create_app``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..storage.snapshots import SnapshotStore
from .fleet import SandboxFleet


def _fleet(request: Request) -> SandboxFleet:
    return request.app.state.fleet


def _store(request: Request) -> SnapshotStore:
    return request.app.state.store


Fleet = Annotated[SandboxFleet, Depends(_fleet)]
Store = Annotated[SnapshotStore, Depends(_store)]

