"""The training loop, once for every way of running it: rollout -> update -> weight sync, per step.

:func:`run` reads top to bottom over the roles of :mod:`.roles.base` (in this process:
:mod:`.roles.local`, or in Ray actors: :mod:`.roles.ray`); the update step's maths is in
:mod:`.roles.update` over :mod:`.algorithms`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from .config import EnvConfig, TrainConfig
from .roles.base import RoleLost, Roles
from .roles.runlog import RunLogger

__all__ = ["run"]


def run(cfg: TrainConfig, open_roles: Callable[..., Roles],
        env_factory: Callable[[EnvConfig], Any] | None = None) -> dict[str, Any]:
    """Train as ``cfg`` says with the roles ``open_roles(cfg, env_factory)`` starts (and this
    closes); return a summary (final step, metrics history, run folder, tokenizer, and what the
    roles hand back)."""
    run_dir = Path(cfg.logging.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    roles = open_roles(cfg, env_factory)
    log, history = None, []
    try:
        # ---- resume: the trainer restores the policy and the RNGs, the batch roles and the
        # rollout their states
        state = roles.trainer.restore()
        start = state["step"] if state else 0
        if state:
            print(f"rockroll: resumed from {state['path']} at step {start}")
            roles.load_batch_state(state.get("roles"))
        roles.sync_weights(start)
        roles.rollout.start(start, state["rollout"] if state else None)

        log = RunLogger(run_dir, tensorboard=cfg.logging.tensorboard, plot=cfg.logging.plot,
                        transcripts=cfg.logging.transcripts, progress=cfg.logging.progress,
                        total_steps=cfg.steps, start_step=start, plot_every=cfg.logging.plot_every,
                        reevaluate_start=bool(cfg.eval.every) and start < cfg.steps and start % cfg.eval.every == 0)
        for step in range(start, cfg.steps):
            if cfg.eval.every and step % cfg.eval.every == 0:  # the weights of version `step`
                log.log_eval(step, roles.rollout.evaluate(cfg.eval.episodes, cfg.eval.seed))
            t0 = time.perf_counter()
            groups, metrics = roles.rollout.get_batch(step)             # 1. rollout
            t_roll = time.perf_counter() - t0
            metrics.update(roles.update(groups))                        # 2-4. batch roles, advantages, loss, steps
            log.transcripts(step, groups, roles.tokenizer)
            if cfg.checkpoint.dir and cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
                _save(roles, step + 1)
            roles.sync_weights(step + 1)                                 # 5. weight sync
            roles.rollout.advance(step + 1)                              # 6. policy version += 1
            metrics.update({"time/rollout_wait_s": t_roll, "time/step_s": time.perf_counter() - t0,
                            "policy_version": step + 1})
            log.log(step, metrics)
            history.append({"step": step, **metrics})
        if cfg.eval.every and cfg.steps > start:  # the final weights, wherever the interval ends
            log.log_eval(cfg.steps, roles.rollout.evaluate(cfg.eval.episodes, cfg.eval.seed))
        if cfg.checkpoint.dir and cfg.steps > start and (not cfg.checkpoint.every or cfg.steps % cfg.checkpoint.every):
            _save(roles, cfg.steps)
    except Exception as e:
        if not (lost := roles.lost(e)):
            raise
        who = lost[0] if len(lost) == 1 else f"{', '.join(lost[:-1])} and {lost[-1]}"
        raise RoleLost(f"{who} {'is' if len(lost) == 1 else 'are'} lost (process or node died: {type(e).__name__}); "
                       f"{_resume_hint(cfg)}") from e
    finally:
        try:
            roles.close()
        finally:
            if log is not None:
                log.close()
    return {"steps": cfg.steps, "start_step": start, "history": history, "run_dir": str(run_dir),
            "tokenizer": roles.tokenizer, **roles.summary()}


def _resume_hint(cfg: TrainConfig) -> str:
    """What a rerun of the same command does: resume from the last checkpoint, or start over."""
    if not cfg.checkpoint.dir:
        return "no checkpoint is kept (checkpoint.dir is not set): a rerun starts over"
    from .roles.checkpoint import latest_checkpoint  # torch: only once there is something to say

    last = latest_checkpoint(cfg.checkpoint.dir)
    return (f"run the same command again to resume from {last}" if last
            else f"no checkpoint was written yet in {cfg.checkpoint.dir}: a rerun starts over")


def _save(roles: Roles, step: int) -> None:
    """A checkpoint of ``step``: in-flight groups finish on the old weights, then the trainer
    saves the policy with the rollout's and the batch roles' states."""
    roles.rollout.pause()
    roles.trainer.save(step, roles.rollout.state_dict(), roles.batch_state())
