"""How much memory this machine can give a training run (plain Python, Linux /proc and cgroup
files; None where they are not there, and the caller skips its check)."""

from typing import Optional


def _read_int(path: str) -> Optional[int]:
  try:
    with open(path, encoding="ascii") as fh:
      text = fh.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None  # cgroup's "max" means no limit


def available_bytes(meminfo: str = "/proc/meminfo",
                    cgroup: str = "/sys/fs/cgroup") -> Optional[int]:
  """MemAvailable, or less when a cgroup (v2) limit leaves less."""
  found = None
  try:
    with open(meminfo, encoding="ascii") as fh:
      for line in fh:
        if line.startswith("MemAvailable:"):
          found = int(line.split()[1]) * 1024
          break
  except (OSError, ValueError, IndexError):
    found = None
  limit, used = _read_int(f"{cgroup}/memory.max"), _read_int(f"{cgroup}/memory.current")
  if limit is not None and used is not None:
    left = max(0, limit - used)
    found = left if found is None else min(found, left)
  return found
