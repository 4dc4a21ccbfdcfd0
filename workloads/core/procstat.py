"""A process's fields from /proc/<pid>/stat, read one way: the fields after the command name,
which may itself hold spaces and parentheses (proc(5): field 3, the state, is index 0 here)."""

from __future__ import annotations

from pathlib import Path


def fields(pid: int | str) -> list[str] | None:
    """The stat fields from the state on, or None for a process that is gone or unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def living(pid: int | str) -> bool:
    """Running: a dead child not reaped yet is a zombie ('Z'), which still has a stat file."""
    f = fields(pid)
    return f is not None and f[0] not in ("Z", "X")
