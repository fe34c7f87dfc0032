"""One handler turns every command's errors into one line, "gpuslice
<command>: <what>", and an exit status by kind: 3 no driver, 1 an error
(the daemon not answering), 2 a bad configuration or request; a bug keeps
its traceback."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from gpuslice import errors, inventory
from gpuslice.cli import app


def run(raise_: BaseException, after: str = "") -> tuple[int, str]:
    @app.group()
    def top() -> None:
        pass

    @top.group("outer")
    def outer() -> None:
        pass

    @outer.command("inner")
    def inner() -> None:
        if after:
            app.after_failure(after)
        raise raise_

    r = CliRunner().invoke(top, ["outer", "inner"])
    if r.exception and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stderr


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (inventory.NoDriver("no NVML"), 3, "gpuslice outer inner: no NVML\n"),
        (errors.Unavailable("the daemon is away"), 1, "gpuslice outer inner: the daemon is away\n"),
        (errors.InvalidArgument("bad"), 2, "gpuslice outer inner: bad\n"),
        (errors.FailedPrecondition("two\nlines"), 2, "gpuslice outer inner: two\ngpuslice outer inner: lines\n"),
        (FileNotFoundError(2, "No such file", "/x"), 2, "gpuslice outer inner: /x: No such file\n"),
    ],
)
def test_each_kind_is_one_line_and_its_status(error, code, line):
    assert run(error) == (code, line)


def test_a_command_says_what_its_failure_left():
    assert run(errors.InvalidArgument("bad"), "; nothing left installed") == (
        2,
        "gpuslice outer inner: bad; nothing left installed\n",
    )


def test_a_bug_is_not_dressed_as_a_refusal():
    with pytest.raises(KeyError):
        run(KeyError("oops"))
    assert run(click.ClickException("click's own")) == (1, "Error: click's own\n")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--workers", "0"], "'--workers': 0 is not in the range 1<=x<=64"),
        (["--alloc-mib", "-5"], "'--alloc-mib': -5 is not in the range x>=1"),
        (["--seconds", "0"], "'--seconds': 0.0 is not in the range 0.1<=x<=600"),
    ],
)
def test_the_demo_refuses_a_workload_that_cannot_run_in_one_line(args, said):
    """`gpuslice demo --workers 0` ran the container demo as if nothing was wrong."""
    from gpuslice.cli.main import main

    r = CliRunner().invoke(main, ["demo", *args])
    assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output


def test_the_container_demo_says_which_options_it_leaves_to_the_processes_demo(monkeypatch):
    from gpuslice.cli import container_demo
    from gpuslice.cli.main import main

    ran = []
    monkeypatch.setattr(app, "sim", lambda: None)
    monkeypatch.setattr(container_demo, "available", lambda: None)
    monkeypatch.setattr(container_demo, "run", lambda echo: ran.append(echo))
    r = CliRunner().invoke(main, ["demo", "--workers", "3", "--seconds", "2"])
    assert r.exit_code == 0 and ran, r.output
    assert "(--workers, --seconds: for the processes demo (--mode processes);" in r.output
    assert "for the processes demo" not in CliRunner().invoke(main, ["demo"]).output
