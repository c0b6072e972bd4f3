"""Running the `mds` CLI in-process for tests, and the one-line error contract."""

from __future__ import annotations

from typer.testing import CliRunner

from mds.cli.main import app


def mds(*args):
    """Invoke `mds ARGS`; a bug (any exception but SystemExit) is re-raised with its traceback."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def one_error_line(result, *needles) -> str:
    """A user error: exit 1, exactly one `error:` line on stderr, no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def json_error(result, *needles) -> dict:
    """A user error under --json: exit 1, nothing on stderr, {"error": {type, message}} on
    stdout."""
    import json

    assert result.exit_code == 1, result.output
    assert result.stderr == "", result.stderr
    error = json.loads(result.stdout)["error"]
    for needle in needles:
        assert needle in error["message"], error
    return error


def run_python(script, cwd, **env: str) -> None:
    """Run a pasted example `script` with this interpreter in `cwd`, one OpenMP thread and
    `env` on top of the environment; it must exit 0."""
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
