"""The `mds` command itself: version, `python -m mds`, completion, py.typed, the one error
path (one stderr line, or JSON on stdout with --json) and missing optional extras."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import subprocess
import sys

import typer.completion
from cli_helpers import json_error, mds, one_error_line
from fault_builders import built_world

import mds as package
from mds.errors import install_hint, missing_extra


def test_version_flags():
    for flag in ("-V", "--version"):
        result = mds(flag)
        assert result.exit_code == 0, result.output
        assert result.stdout == f"mds {package.__version__}\n"


def test_version_matches_the_distribution():
    assert importlib.metadata.version(package.DISTRIBUTION) == package.__version__


def test_python_dash_m():
    out = subprocess.run(
        [sys.executable, "-m", "mds", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout == f"mds {package.__version__}\n"


def test_shell_completion_script(monkeypatch):
    result = mds("--help")
    assert "--install-completion" in result.stdout
    # typer takes the shell from the process tree, whatever follows the flag; which shell
    # runs the tests is not what this checks
    monkeypatch.setattr(typer.completion, "_get_shell_name", lambda: "bash")
    script = mds("--show-completion", "bash")
    assert script.exit_code == 0, script.output
    assert "_MDS_COMPLETE" in script.stdout


def test_py_typed_ships():
    assert importlib.resources.files("mds").joinpath("py.typed").is_file()


def test_error_is_one_stderr_line_or_json_on_stdout(tmp_path):
    missing = tmp_path / "missing.toml"
    one_error_line(mds("plan", missing, "-o", tmp_path / "p.mds"), "config file not found")
    error = json_error(mds("plan", missing, "-o", tmp_path / "p.mds", "--json"), "not found")
    assert error == {"type": "ConfigError", "message": f"{missing}: config file not found"}


def test_every_json_command_reports_errors_as_json(tmp_path):
    missing = tmp_path / "missing"
    for args in (
        ("index", missing, "-o", tmp_path / "i"),
        ("plan", missing, "-o", tmp_path / "p.mds"),
        ("export", missing, "-o", tmp_path / "p.parquet"),
        ("inspect", missing),
        ("verify", missing),
        ("diff", missing, missing),
    ):
        result = mds(*args, "--json")
        assert result.exit_code == 1, (args, result.output)
        assert "message" in json.loads(result.stdout)["error"], args


def test_missing_extra_names_the_extra():
    error = missing_extra(ModuleNotFoundError("No module named 'polars'", name="polars"))
    assert str(error) == (
        f"this command needs polars, which is not installed: {install_hint('plan')}"
    )
    assert missing_extra(ModuleNotFoundError("x", name="no_such_module")) is None


def test_missing_extra_from_the_command_line(tmp_path):
    # polars "not installed": a planning command says which extra, in one line
    code = (
        "import sys; sys.modules['polars'] = None; from mds.cli.main import run; "
        f"sys.argv = ['mds', 'plan', {str(tmp_path / 'x.toml')!r}, '-o', 'p.mds']; run()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stderr == (
        f"error: this command needs polars, which is not installed: {install_hint('plan')}\n"
    )


def test_an_interrupt_after_an_output_was_written_names_it(tmp_path, monkeypatch):
    """Ctrl-C once the plan is in place (while its summary prints): not "nothing was
    written", on stderr or as JSON."""
    root = built_world(tmp_path)
    import mds.cli.plan as plan_cli

    def interrupted(summary):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_cli, "_print_summary", interrupted)
    out = root / "new.mds"
    result = mds("plan", root / "mds.toml", "-o", out)
    assert result.exit_code == 130
    said = f"the interrupt came after {out} was written whole"
    assert result.stderr.strip() == f"interrupted: {said}"
    out.unlink()
    monkeypatch.setattr(plan_cli, "print_json", interrupted)
    result = mds("plan", root / "mds.toml", "-o", out, "--json")
    assert result.exit_code == 130
    assert json.loads(result.stdout) == {"error": {"type": "Interrupted", "message": said}}


def test_an_interrupt_before_any_output_says_nothing_was_written(root, monkeypatch):
    import mds.planner.plan.build as plan_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_module, "_build_locked", interrupted)
    result = mds("plan", root / "mds.toml", "-o", root / "new.mds")
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted: nothing was written"
