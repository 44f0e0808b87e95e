"""Shell completion: the script `launch completion bash` prints, sourced in a real bash, completes profile
names and run ids through the installed `launch` (click's `_LAUNCH_COMPLETE` protocol); every argument
of the tree that takes a profile or a run completes; a TAB reads the registry without SkyPilot."""

import subprocess
import sys

import click
import pytest
from click.shell_completion import ShellComplete

from launcher.cli import cli
from launcher.store import registry
from launcher.term.completion import Completed
from walk import LAUNCH, REPO, fresh_env, launch

RUN_ID = "sonia-h100-20261202-064500"


def bash_completes(tmp_path, line: str, cwd=None) -> list[str]:
    """COMPREPLY for `line` in a bash that sourced `launch completion bash`, as a TAB would fill it."""
    script = f"""
        set -e
        eval "$(launch completion bash)"
        complete -p launch
        COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}
        read -ra COMP_WORDS <<< "$COMP_LINE"
        [[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
        COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
        _launch_completion launch "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
        for c in "${{COMPREPLY[@]}}"; do printf 'reply:%s\\n' "$c"; done
    """
    env = fresh_env(tmp_path, {"PATH": f"{LAUNCH.parent}:/usr/bin:/bin"})
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], env=env, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=cwd or REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "complete -o nosort -F _launch_completion launch" in r.stdout
    return [line.removeprefix("reply:") for line in r.stdout.splitlines() if line.startswith("reply:")]


def save_run(tmp_path, monkeypatch, run_id=RUN_ID, **kw):
    """A run in the registry the subprocess's fresh environment reads (walk's LAUNCH_HOME)."""
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    registry.save(registry.Run(id=run_id, profile=kw.pop("profile", "sonia-h100"), backend="skypilot",
                               state=kw.pop("state", "running"), **kw))


def test_sourced_in_bash_it_completes_profiles_and_run_ids(tmp_path, monkeypatch):
    save_run(tmp_path, monkeypatch)
    assert bash_completes(tmp_path, "launch plan so") == ["sonia-h100"]
    assert bash_completes(tmp_path, "launch logs sonia") == [RUN_ID]
    assert bash_completes(tmp_path, "launch down ") == [RUN_ID]
    assert "completion" in bash_completes(tmp_path, "launch comp")
    assert bash_completes(tmp_path, "launch plan --re") == ["--rehearse"]


def test_outside_a_project_init_from_completes_the_shipped_examples(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bash_completes(tmp_path, "launch init mine --from lo", cwd=empty) == ["local-demo", "lovecraft-a100-spot"]
    assert bash_completes(tmp_path, "launch plan lo", cwd=empty) == []  # plan takes the project's only


@pytest.mark.parametrize("shell, first", [("bash", "_launch_completion() {"), ("zsh", "#compdef launch"),
                                          ("fish", "function _launch_completion;")])
def test_completion_prints_each_shells_script(tmp_path, shell, first):
    r = launch(tmp_path, "completion", shell)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == first  # zsh reads #compdef on a completion file's first line
    assert "_LAUNCH_COMPLETE" in r.stdout and lines[-1].startswith(f"# launch's {shell} completion; install: ")


def test_an_unknown_shell_is_one_line(tmp_path):
    r = launch(tmp_path, "completion", "powershell")
    assert r.returncode == 2 and "'powershell' is not one of 'bash', 'zsh', 'fish'" in r.stderr


def completions(args: list[str], incomplete: str) -> list[str]:
    return [c.value for c in ShellComplete(cli, {}, "launch", "_LAUNCH_COMPLETE").get_completions(args, incomplete)]


def test_every_profile_and_run_argument_completes():
    """Found by name over the whole tree: a command added later that takes `run_id` completes too."""
    def walk(cmd, path):
        for p in cmd.params:
            yield path, p
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    kinds = {}
    for path, p in walk(cli, "launch"):
        if p.name in ("profile", "profiles", "run_id", "run_ids") or p.metavar == "PROFILE":
            assert isinstance(p.type, Completed), f"{path} {p.name}"
            kinds.setdefault(p.type.name, []).append(path)
    assert {"launch plan", "launch up", "launch render", "launch init", "launch data preview"} <= set(kinds["profile"])
    assert {"launch logs", "launch status", "launch down", "launch compare", "launch exec"} <= set(kinds["run"])


def test_names_prefixes_paths_and_values_given(tmp_path, monkeypatch):
    for i, rid in enumerate(("local-demo-20261202-010101", "local-demo-20261202-020202")):
        registry.save(registry.Run(id=rid, profile="local-demo", backend="local", started_at=1000.0 + i))
    assert completions(["status"], "") == ["local-demo-20261202-020202", "local-demo-20261202-010101"]  # newest first
    assert completions(["compare", "local-demo-20261202-020202"], "local") == ["local-demo-20261202-010101"]
    assert completions(["init", "x", "--from"], "sonia") == ["sonia-h100"]
    assert completions(["render", "sonia-h100"], "so") == []
    items = ShellComplete(cli, {}, "launch", "_LAUNCH_COMPLETE").get_completions(["plan"], "clusters/so")
    assert [(c.type, c.value) for c in items] == [("file", "clusters/so")]  # the shell completes the path
    items = ShellComplete(cli, {}, "launch", "_LAUNCH_COMPLETE").get_completions(["ssh"], "")
    assert [c.help for c in items] == ["starting, local", "starting, local"]


def test_no_registry_completes_nothing_and_creates_none(tmp_path, monkeypatch):
    home = tmp_path / "launch-home"
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    assert completions(["logs"], "") == []
    assert not (home / "runs.db").exists()


def test_an_unusable_launch_home_completes_nothing_quietly(tmp_path, monkeypatch, capsys):
    home = tmp_path / "launch-home"
    home.write_text("a file where LAUNCH_HOME should be a directory")
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    assert launch(tmp_path, "status", env={"LAUNCH_HOME": str(home)}).returncode == 1  # a command says so
    assert completions(["logs"], "") == []  # a TAB does not
    assert capsys.readouterr().err == ""


def test_a_tab_imports_no_skypilot(tmp_path, monkeypatch):
    save_run(tmp_path, monkeypatch)
    code = ("import sys; from click.shell_completion import ShellComplete; from launcher.cli import cli; "
            "c = ShellComplete(cli, {}, 'launch', '_LAUNCH_COMPLETE'); "
            "assert [i.value for i in c.get_completions(['logs'], '')] == [sys.argv[1]]; "
            "assert [i.value for i in c.get_completions(['plan'], 'so')] == ['sonia-h100']; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sky', 'torch', 'rich', 'paramiko')))")
    r = subprocess.run([sys.executable, "-c", code, RUN_ID], env=fresh_env(tmp_path), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_completed_keeps_the_argument_a_string():
    t = Completed("run", lambda: [])
    assert t.convert("abc", None, None) == "abc" and isinstance(t, click.types.StringParamType)
