"""Files other processes read while they change: written whole beside the target, then renamed over it, so a
reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_whole(path: Path, text: str, private: bool = False) -> None:
    """Replace `path` with `text` atomically. `private`: the file is readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates it 0600
        side = Path(name)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        except BaseException:
            side.unlink(missing_ok=True)
            raise
    else:
        side = path.with_name(f".{path.name}.partial")
        side.write_text(text)
    try:
        os.replace(side, path)
    except BaseException:
        side.unlink(missing_ok=True)
        raise
