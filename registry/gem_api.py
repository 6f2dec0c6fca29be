"""rockroll's registered envs over ROCK's GEM API (``/apis/v1/envs/gem``), for ``rock.make``.

    # ROCK_BASE_URL=http://rock:TOKEN@127.0.0.1:8765
    from rock.sdk.envs import make
    env = make("rock/FrozenLake-v0"); env.reset(seed=0); env.step("<answer>Right</answer>")

``make`` / ``reset`` / ``step`` / ``close`` / ``list``, answered as ROCK's admin answers them
(bare JSON, no envelope). Every ``rock/...`` id of the gymnasium registry can be made:
the built-ins and every env of the hub ``import rockroll`` registered. Each made env is an
instance of its own (an env that needs a sandbox opens its own, as it does locally) and is
closed with ``close``, after the service's idle timeout, or when the service stops.

ROCK's env client sends no auth header, so the token rides in the userinfo of
``ROCK_BASE_URL`` (HTTP Basic; ``sandbox/server/compat.py`` checks it like every other).

This module lives in ``registry`` because it makes envs: ``sandbox`` cannot import it
(dependencies go ``registry -> sandbox``), so ``rockroll serve`` hands ``GemEnvs()`` to
``create_app(extensions=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any, AsyncIterator

import gymnasium
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from rockroll.sandbox.server import compat
from rockroll.sandbox.protocol.wire import AuthError

PREFIX = "/apis/v1/envs/gem"
NAMESPACE = "rock/"  # only rockroll's ids: the service makes nothing else of the gymnasium registry


class GemEnvError(Exception):
    """A request the GEM API refuses; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _answer(e: Exception) -> JSONResponse | None:
    if isinstance(e, AuthError):
        return JSONResponse({"detail": str(e)}, status_code=401)
    if isinstance(e, GemEnvError):
        return JSONResponse({"detail": str(e)}, status_code=e.status)
    if isinstance(e, RequestValidationError):
        return JSONResponse({"detail": compat.first_error(e)}, status_code=422)
    return None


router = APIRouter(prefix=PREFIX, route_class=compat.route_class(_answer), dependencies=[Depends(compat.check_token)])


def plain(value: Any) -> Any:
    """``value`` as JSON can carry it (numpy scalars, tuples, sets...: their str at worst)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


class _Made:
    """One made env: calls on it run one at a time, off the event loop."""

    def __init__(self, env_id: str, env: gymnasium.Env):
        self.env_id, self.env = env_id, env
        self.lock = asyncio.Lock()
        self.last_used = time.time()

    async def call(self, fn, *args, **kwargs):
        async with self.lock:
            self.last_used = time.time()
            try:
                return await asyncio.to_thread(fn, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - e.g. step before reset: the caller's, named
                raise GemEnvError(400, f"{fn.__name__}: {type(e).__name__}: {e}") from None
            finally:
                self.last_used = time.time()


class GemEnvs:
    """The envs one service made, by id; an ``Extension`` of ``create_app``."""

    router = router

    def __init__(self, idle_ttl: float | None = 3600.0, reap_interval: float | None = None):
        self.idle_ttl = idle_ttl
        # often enough that an env outlives its idle time by a fraction of it at most
        self.reap_interval = reap_interval or (min(5.0, idle_ttl / 2) if idle_ttl else 5.0)
        self.envs: dict[str, _Made] = {}

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        app.state.gem_envs = self
        reaper = asyncio.create_task(self._reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            await asyncio.gather(*(self.close(i) for i in list(self.envs)), return_exceptions=True)

    def ids(self) -> list[str]:
        from .hub import is_base_image

        return sorted(i for i in gymnasium.registry if i.startswith(NAMESPACE) and not is_base_image(i))

    async def make(self, env_id: str) -> str:
        if not env_id.startswith(NAMESPACE) or env_id not in gymnasium.registry:
            raise GemEnvError(404, f"env_id: no env {env_id!r} here; these are: {', '.join(self.ids())}")
        try:
            env = await asyncio.to_thread(gymnasium.make, env_id)
        except Exception as e:  # noqa: BLE001 - a broken env is the caller's 400, named
            raise GemEnvError(400, f"env_id: {env_id} could not be made: {type(e).__name__}: {e}") from None
        made_id = f"env-{uuid.uuid4().hex[:12]}"
        self.envs[made_id] = _Made(env_id, env)
        return made_id

    def get(self, made_id: str) -> _Made:
        made = self.envs.get(made_id)
        if made is None:
            raise GemEnvError(404, f"sandbox_id: no env {made_id!r} (closed, idle too long, or never made)")
        return made

    async def close(self, made_id: str) -> None:
        made = self.envs.pop(made_id, None)
        if made is not None:
            await made.call(made.env.close)

    async def reap_idle(self) -> list[str]:
        now = time.time()
        idle = [i for i, m in self.envs.items()
                if self.idle_ttl is not None and not m.lock.locked() and now - m.last_used > self.idle_ttl]
        await asyncio.gather(*(self.close(i) for i in idle), return_exceptions=True)
        return idle

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval)
            await self.reap_idle()


def _envs(request: Request) -> GemEnvs:
    return request.app.state.gem_envs


class MakeIn(BaseModel):
    env_id: str = Field(min_length=1)


class IdIn(BaseModel):
    sandbox_id: str = Field(min_length=1)


class ResetIn(IdIn):
    seed: int | None = None


class StepIn(IdIn):
    action: str


class ListIn(BaseModel):
    sandbox_id: str | None = None


@router.post("/make")
async def make(body: MakeIn, envs: GemEnvs = Depends(_envs)) -> dict:
    return {"sandbox_id": await envs.make(body.env_id)}


@router.post("/reset")
async def reset(body: ResetIn, envs: GemEnvs = Depends(_envs)) -> dict:
    made = envs.get(body.sandbox_id)
    observation, info = await made.call(made.env.reset, seed=body.seed)
    return {"observation": plain(observation), "info": plain(info)}


@router.post("/step")
async def step(body: StepIn, envs: GemEnvs = Depends(_envs)) -> dict:
    made = envs.get(body.sandbox_id)
    observation, reward, terminated, truncated, info = await made.call(made.env.step, body.action)
    return {"observation": plain(observation), "reward": float(reward), "terminated": bool(terminated),
            "truncated": bool(truncated), "info": plain(info)}


@router.post("/close")
async def close(body: IdIn, envs: GemEnvs = Depends(_envs)) -> dict:
    envs.get(body.sandbox_id)
    await envs.close(body.sandbox_id)
    return {"sandbox_id": body.sandbox_id}


@router.post("/list")
async def list_envs(body: ListIn, envs: GemEnvs = Depends(_envs)) -> dict:
    return {"env_id": envs.ids()}
