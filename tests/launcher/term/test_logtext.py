"""Terminal control codes stay out of what launch writes: `launch logs` into a pipe or a file, and the
fetched logs/ (launcher/term/logtext.py). Progress bars that redraw with `\\r` keep their last state.

Run: .venv/bin/python -m pytest -q tests/launcher/term/test_logtext.py
"""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.backends.local import LocalBackend
from launcher.cli import cli
from launcher.term.logtext import CleanWriter, clean_file, clean_line
from launcher.store.registry import Run

RAW = ("\x1b[32mINFO\x1b[0m loading model\n"
       "Downloading:  10%|#         | 1/10\rDownloading: 100%|##########| 10/10\r\n"
       "\x1b]0;window title\x07step 1 loss 2.5 \x1b[1;33m$0.12\x1b[0m\n"
       "\x1b[2K\x1b[1Gplain café\n"
       "no newline at the end \x1b[0m")
CLEAN = ("INFO loading model\n"
         "Downloading: 100%|##########| 10/10\n"
         "step 1 loss 2.5 $0.12\n"
         "plain café\n"
         "no newline at the end ")


@pytest.mark.parametrize("line, want", [
    ("\x1b[31mred\x1b[0m\n", "red\n"), ("a\rb\rc\n", "c\n"), ("done\r\n", "done\n"), ("\x1b7saved\x1b8", "saved"),
    ("[not an escape] 100%\n", "[not an escape] 100%\n"), ("", ""),
])
def test_clean_line(line, want):
    assert clean_line(line) == want


def test_clean_file_and_writer_keep_what_a_terminal_shows(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(RAW, encoding="utf-8")
    clean_file(path)
    assert path.read_text(encoding="utf-8") == CLEAN
    out = io.StringIO()
    w = CleanWriter(out)
    for i in range(0, len(RAW), 7):  # escape sequences split across writes
        w.write(RAW[i:i + 7])
    w.close_pending()
    assert out.getvalue() == CLEAN


def test_launch_logs_into_a_pipe_has_no_terminal_codes():
    run = Run(id="local-demo-1", profile="local-demo", backend="local", state="completed")
    registry.save(run)
    log = LocalBackend.home(run) / "run.log"
    log.parent.mkdir(parents=True)
    log.write_text(RAW, encoding="utf-8")
    r = CliRunner().invoke(cli, ["logs", "local-demo-1"])  # CliRunner's stdout is not a terminal
    assert r.exit_code == 0, r.output
    assert r.output == CLEAN
    assert log.read_bytes() == RAW.encode()  # the run's own log is left as written
