"""The ``rockroll`` command line."""

from __future__ import annotations

import json
import sys

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rockroll")
def main() -> None:
    """rockroll: sandboxes, env hub, GEM environments and a trainer for agentic RL."""


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
                     help="Allow network access (default: loopback only).")(f)
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
    """An interactive shell in a fresh sandbox (each line runs in one persistent session;
    no terminal, so full-screen programs do not work). Exit with Ctrl-D or 'exit'."""
    from rockroll.sandbox import open_sandbox

    spec = _make_spec(image, backend, memory_mb, cpus, network)
    with open_sandbox(spec) as sb:
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


@sandbox.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sandbox_ls(as_json):
    """List runs (processes that own sandboxes) and their sandboxes."""
    from rockroll.sandbox.registry import list_runs

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
    """Remove what dead runs left behind: processes, cgroups, directories."""
    from rockroll.sandbox.registry import reap_dead_runs

    reaped = reap_dead_runs(include_live=everything)
    click.echo(f"reaped {len(reaped)} run(s)" + (f": {' '.join(reaped)}" if reaped else ""))


if __name__ == "__main__":
    main()
