"""Routes of a sandbox's files: streamed both ways, a directory as a tar."""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from ..protocol.wire import ExistsOut
from .deps import Fleet

router = APIRouter()


@router.put("/sandboxes/{sandbox_id}/files", status_code=204,
            openapi_extra={"requestBody": {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}})
async def put_file(request: Request, sandbox_id: str, fleet: Fleet, path: str = Query(min_length=1),
                   mode: int = Query(0o644, ge=0, le=0o7777),
                   tar: bool = Query(False, description="the body is a tar to unpack into `path`")) -> Response:
    entry = fleet.get(sandbox_id)
    await fleet.call(entry, entry.sb.write_stream(path, request.stream(), mode=mode, tar=tar))
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}/files",
            responses={200: {"content": {"application/octet-stream": {}, "application/x-tar": {}},
                             "description": "the file's bytes, or a tar of a directory "
                                            "(header X-Rockroll-Type: file | dir)"}})
async def get_file(sandbox_id: str, fleet: Fleet, path: str = Query(min_length=1)) -> Response:
    entry = fleet.get(sandbox_id)
    # The first chunk is read before answering: a missing file is an error status, not a cut stream.
    kind, chunks = await fleet.call(entry, entry.sb.read_stream(path))
    if kind == "dir":
        data = b"".join([chunk async for chunk in chunks])
        return Response(data, media_type="application/x-tar", headers={"X-Rockroll-Type": "dir"})

    async def guarded() -> AsyncIterator[bytes]:
        async with fleet.using(entry):
            async for chunk in chunks:
                yield chunk

    return StreamingResponse(guarded(), media_type="application/octet-stream",
                             headers={"X-Rockroll-Type": "file"})


@router.get("/sandboxes/{sandbox_id}/exists", response_model=ExistsOut)
async def exists(sandbox_id: str, fleet: Fleet, path: str = Query(min_length=1)) -> ExistsOut:
    entry = fleet.get(sandbox_id)
    kind = await fleet.call(entry, entry.sb.stat(path))
    return ExistsOut(exists=kind is not None, type=kind)
