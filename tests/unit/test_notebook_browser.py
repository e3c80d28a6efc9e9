"""`hpcbox notebook` opens the lab in a browser without putting its token on a command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_browser_is_handed_a_private_page_that_leads_to_the_lab_and_never_the_token(tmp_path: Path):
    """A browser's command line is on every user's process list: it gets a page of a folder of yours
    (0600) that redirects to the lab, as Jupyter's own redirect file does. Run in a process of its own,
    with $BROWSER a program that records what it was given (webbrowser reads $BROWSER once)."""
    recorder = tmp_path / "browser"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/argv"\n')
    recorder.chmod(0o755)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    url = "http://127.0.0.1:40123/lab?token=" + "ab" * 24
    opened = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; from hpcbox.jobs.notebook import "
         "open_in_browser; print(open_in_browser(sys.argv[1], Path(sys.argv[2])))", url, str(private)],
        env={**os.environ, "DISPLAY": ":99", "BROWSER": str(recorder)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert opened.stdout.strip() == "True", opened.stderr
    given = (tmp_path / "argv").read_text().split()
    page = private / "open-jupyterlab.html"
    assert given == [page.as_uri()] and "token" not in " ".join(given)
    assert page.stat().st_mode & 0o777 == 0o600
    assert f'content="0;url={url}"' in page.read_text()
