"""Routes of the warm pools: keep warm sandboxes of a spec for ``POST /v1/sandboxes``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ..errors import SandboxNotFound
from ..protocol.wire import PoolIn, PoolOut
from .deps import Fleet

router = APIRouter()


@router.get("/pools", response_model=list[PoolOut])
async def list_pools(fleet: Fleet) -> list[PoolOut]:
    return [w.describe() for w in fleet.pools.values()]


@router.post("/pools", response_model=PoolOut, status_code=201,
             responses={200: {"model": PoolOut, "description": "the pool of that spec was resized"}})
async def add_pool(body: PoolIn, fleet: Fleet, response: Response) -> PoolOut:
    """Keep ``size`` warm sandboxes of this spec; returns once they are warm. A pool of
    the same spec (after defaults) and snapshot is resized instead (200)."""
    warm, new = await fleet.add_pool(body)
    if not new:
        response.status_code = 200
    return warm.describe()


@router.get("/pools/{pool_id}", response_model=PoolOut)
async def get_pool(pool_id: str, fleet: Fleet) -> PoolOut:
    return _pool(fleet, pool_id).describe()


@router.delete("/pools/{pool_id}", status_code=204)
async def delete_pool(pool_id: str, fleet: Fleet) -> Response:
    """Close the pool and every sandbox it owns, those handed out included (their clients
    get 409 ``SandboxClosed``)."""
    _pool(fleet, pool_id)
    await fleet.remove_pool(pool_id)
    return Response(status_code=204)


def _pool(fleet, pool_id: str):
    warm = fleet.pools.get(pool_id)
    if warm is None:
        raise SandboxNotFound(f"no pool {pool_id!r}")
    return warm
