"""What every `gpuslice` command shares: one handler that turns gpuslice's
error kinds into one line and an exit status, the simulator when a command
needs it, and how a node component logs and serves.

Exit statuses (docs/daemon.md): 0 done; 1 an error (a failed check, an
invalid spec, the daemon or another service not answering); 2 a bad
configuration or request (any other of gpuslice's error kinds, a path that
cannot be used); 3 no usable NVIDIA driver (NVML cannot be loaded): systemd
does not restart on it."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn, Protocol

import click

from gpuslice import errors, simulator, stop_signals

EXIT_ERROR, EXIT_BAD_INPUT, EXIT_NO_DRIVER = 1, 2, 3
_COMMAND, _AFTER = "gpuslice.command", "gpuslice.after"


def after_failure(text: str) -> None:
    """What the running command's failure line ends with (say, "; nothing left installed")."""
    click.get_current_context().meta[_AFTER] = text


def exit_status(e: BaseException) -> int | None:
    """The exit status for an error a command did not handle; None: not ours (a bug: its traceback)."""
    import pynvml

    from gpuslice import inventory

    if isinstance(e, inventory.NoDriver):
        return EXIT_NO_DRIVER
    if isinstance(e, errors.Unavailable):
        return EXIT_ERROR
    if isinstance(e, errors.GpusliceError | pynvml.NVMLError | OSError):
        return EXIT_BAD_INPUT
    return None


def failure_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e)


class Command(click.Command):
    def invoke(self, ctx: click.Context) -> Any:
        names = []
        at: click.Context | None = ctx
        while at is not None and at.parent is not None:
            names.append(at.info_name or "")
            at = at.parent
        ctx.meta[_COMMAND] = " ".join(reversed(names))
        return super().invoke(ctx)


class Group(click.Group):
    """A group whose commands and subgroups are ours; the outermost one turns
    their errors into lines and exit statuses, in one place."""

    command_class = Command
    group_class = type  # subgroups: this class too

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.parent is not None:
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:
            code = exit_status(e)
            if code is None:
                raise
            where = ctx.meta.get(_COMMAND, "")
            prefix = f"gpuslice {where}: " if where else "gpuslice: "
            lines = failure_line(e).splitlines() or [type(e).__name__]
            lines[-1] += ctx.meta.get(_AFTER, "")
            click.echo("\n".join(prefix + line for line in lines), err=True)
            ctx.exit(code)


def command(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Command]:
    return click.command(*args, cls=Command, **kwargs)


def group(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Group]:
    return click.group(*args, cls=Group, **kwargs)


def fail(line: str, code: int = EXIT_ERROR) -> NoReturn:
    """End the command with one line of our own (a failed check, an invalid file)."""
    click.echo(line, err=True)
    sys.exit(code)


def sim() -> ModuleType:
    """gpuslice-sim; without it, the one line that names the package to install (exit 2)."""
    simulator.require()
    import gpuslice_sim

    return gpuslice_sim


def log_as(name: str, verbose: bool) -> None:
    """INFO, or DEBUG with --verbose; GPUSLICE_DEBUG names loggers to debug alone (comma-separated,
    e.g. gpuslice.allocator.cost_split: how the compute controller splits the GPU's time)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=f"gpuslice-{name}: %(message)s")
    for logger in filter(None, os.environ.get("GPUSLICE_DEBUG", "").split(",")):
        logging.getLogger(logger.strip()).setLevel(logging.DEBUG)


class Served(Protocol):
    stopping: Any

    def serve(self) -> None: ...


def serve(make: Callable[[], Served]) -> None:
    """Build a node component and serve it until SIGTERM or SIGINT."""
    p = make()
    stop_signals.set_on_signals(p.stopping)
    p.serve()
