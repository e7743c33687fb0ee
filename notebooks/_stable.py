"""Keep the walkthroughs' printed output the same from run to run.

The demo services listen on ports the OS chooses, and those ports appear in
previews, errors and event details. ``mask_ports()`` replaces
``127.0.0.1:<number>`` with ``127.0.0.1:<port>`` in everything printed
afterwards, so a re-executed notebook differs from the committed one only
where its story changed.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

_PORT = re.compile(r"127\.0\.0\.1:\d+")


class _Masked:
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(_PORT.sub("127.0.0.1:<port>", text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def mask_ports() -> None:
    """Mask loopback port numbers in everything printed to stdout from now on."""
    if not isinstance(sys.stdout, _Masked):
        sys.stdout = _Masked(sys.stdout)


def workdir(prefix: str) -> Path:
    """A new directory for one notebook's files: ``<parent>/<prefix><random>``.

    The parent is ``EFFECTGATE_NOTEBOOK_DIR`` when set (the test suite sets
    it), created with its parents if missing; else the system temp dir.
    """
    parent = os.environ.get("EFFECTGATE_NOTEBOOK_DIR") or None
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
