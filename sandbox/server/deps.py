"""What every route takes from the app it runs in (set once by ``create_app``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..storage.snapshots import SnapshotStore
from .hub import SandboxHub


def _hub(request: Request) -> SandboxHub:
    return request.app.state.hub


def _store(request: Request) -> SnapshotStore:
    return request.app.state.store


Hub = Annotated[SandboxHub, Depends(_hub)]
Store = Annotated[SnapshotStore, Depends(_store)]

