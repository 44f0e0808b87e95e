"""`make lint` (scripts/lint.sh): shellcheck gets every shell script of the checkout and the rendered
tasks' setup/run (scripts/shell_files.py), and a machine without shellcheck or a way to install it
says so in one line instead of failing."""

import importlib.util
import os
import subprocess
import sys

from walk import REPO


def shell_files():
    spec = importlib.util.spec_from_file_location("shell_files", REPO / "scripts" / "shell_files.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_shell_script_is_linted_the_backends_scripts_among_them(tmp_path):
    mod = shell_files()
    found = set(mod.scripts())
    backends = {f"launcher/backends/sh/{p.name}" for p in (REPO / "launcher" / "backends" / "sh").glob("*.sh")}
    assert {"payload/gpu_env.sh", "scripts/lint.sh", ".ci/run", "launcher/backends/sh/driver.sh"} <= found
    assert backends <= found and len(backends) >= 8
    assert not {f for f in found if f.endswith(".py")}
    tasks = mod.task_scripts(tmp_path)
    assert {p.name for p in tasks} >= {"local-demo.run.sh", "sonia-h100.setup.sh", "sonia-h100.run.sh"}
    assert all(p.read_text().startswith("# shellcheck shell=bash\n") for p in tasks)


def test_without_shellcheck_and_apt_lint_says_why_it_skipped(tmp_path):
    bin_dir = tmp_path / "bin"  # what lint.sh calls besides bash builtins, without shellcheck or apt-get
    bin_dir.mkdir()
    for tool in ("dirname", "id"):
        os.symlink(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip(), bin_dir / tool)
    env = {**os.environ, "PATH": str(bin_dir), "BIN": str(os.path.dirname(sys.executable))}
    r = subprocess.run(["/bin/bash", str(REPO / "scripts" / "lint.sh")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "shellcheck not run: not installed, and installing it needs root and apt-get" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
