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
