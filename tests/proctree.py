"""The process tree as /proc tells it (Linux), for tests that start, kill and count real processes."""

from __future__ import annotations

import os
from pathlib import Path


def _parents() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return children


def children(pid: int) -> list[int]:
    return _parents().get(pid, [])


def descendants(pid: int) -> list[int]:
    tree = _parents()
    found, todo = [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as gone)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def named(pids: list[int], word: str) -> list[int]:
    """Those of `pids` whose command line contains `word`."""
    return [pid for pid in pids if word in cmdline(pid)]
