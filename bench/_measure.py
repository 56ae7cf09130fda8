"""Small measuring helpers for the benchmarks: peak RSS of processes, directory sizes, and
figures rounded for their JSON lines.

Peak memory comes from Linux's ``/proc/<pid>/status`` (``VmHWM``, the resident high-water
mark); writing ``5`` to ``/proc/<pid>/clear_refs`` resets it, so a benchmark can measure
one engine at a time in a shared process. Elsewhere the functions return None.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc``; [pid] if unreadable)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pid]
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def reset_peak(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_mb(pids: list[int]) -> float | None:
    """Sum of the peak RSS of ``pids`` in MiB (None if none could be read)."""
    values = [_status_kb(pid, "VmHWM") for pid in pids]
    known = [v for v in values if v is not None]
    return round(sum(known) / 1024, 1) if known else None


def dir_bytes(path: Path) -> int:
    """Total size of the regular files under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def rounded(value: Any) -> Any:
    """``value`` with every float (in lists and dicts too) rounded to 4 places."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value
