"""TensorBoard, served on this machine over a folder of event files: `hpcbox watch --tensorboard`."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.tools import proc


@contextlib.contextmanager
def serving(logdir: Path) -> Iterator[str]:
    """TensorBoard over ``logdir`` (made if missing: a job's curves come later) on a free local port,
    for the block, which starts once it answers; its URL. It reads the folder again every 2 s, so
    curves fetched into it meanwhile appear."""
    if importlib.util.find_spec("tensorboard") is None:
        raise HpcboxError(
            "--tensorboard needs TensorBoard here", "pip install 'hpcbox[watch]' (or tensorboard itself)"
        )
    logdir.mkdir(parents=True, exist_ok=True)
    port = proc.free_local_port()
    url = f"http://127.0.0.1:{port}/"
    argv = [
        sys.executable, "-m", "tensorboard.main", f"--logdir={logdir}", "--host=127.0.0.1", f"--port={port}",
        "--reload_interval=2",
    ]  # fmt: skip
    with proc.background(argv, what="serve TensorBoard", ready=lambda: _answers(url)):
        yield url


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False
