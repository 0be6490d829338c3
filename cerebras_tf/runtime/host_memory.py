"""How much memory this process can still get for a training run (plain Python, Linux /proc
and cgroup files, and the process's own rlimits; None where none of them say, and the caller
skips its check).

The least of what each limit leaves is what counts: the machine's MemAvailable; the memory
cgroup the process runs in (v2 `memory.max` - `memory.current`, v1 `memory.limit_in_bytes` -
`memory.usage_in_bytes`, each level up to the root, as a container or a scheduler's job sets
it); and the process's address-space and data rlimits (`ulimit -v`, `ulimit -d`) less what it
already maps. Reading only the machine's memory let a job under `ulimit -v` 4 GiB start a 4.3 GB
model and end in a 167-line ResourceExhaustedError.
"""

import os
import resource
from typing import Iterable, List, Optional, Tuple

# cgroup v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712).
_NO_LIMIT = 2 ** 62


def _read_int(path: str) -> Optional[int]:
  try:
    with open(path, encoding="ascii") as fh:
      text = fh.read().strip()
  except OSError:
    return None
  if not text.isdigit():
    return None  # cgroup v2's "max" means no limit
  value = int(text)
  return value if value < _NO_LIMIT else None


def _mem_available(meminfo: str) -> Optional[int]:
  try:
    with open(meminfo, encoding="ascii") as fh:
      for line in fh:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    return None
  return None


def _cgroup_paths(proc_cgroup: str) -> Tuple[Optional[str], Optional[str]]:
  """(v2 path, v1 memory path) of this process's cgroups, from /proc/self/cgroup."""
  v2 = v1 = None
  try:
    with open(proc_cgroup, encoding="utf-8") as fh:
      for line in fh:
        parts = line.rstrip("\n").split(":", 2)
        if len(parts) != 3:
          continue
        if parts[0] == "0" and parts[1] == "":
          v2 = parts[2]
        elif "memory" in parts[1].split(","):
          v1 = parts[2]
  except OSError:
    pass
  return v2, v1


def _levels(root: str, path: Optional[str]) -> List[str]:
  """root/path and each directory above it up to root (a parent's limit binds its children);
  just root when the path is unknown (in a container the namespace's root is its own)."""
  out = []
  parts = [p for p in (path or "").split("/") if p]
  for i in range(len(parts), -1, -1):
    out.append(os.path.join(root, *parts[:i]))
  return out


def _cgroup_left(dirs: Iterable[str], limit_file: str, usage_file: str) -> Optional[int]:
  found = None
  for d in dirs:
    limit, used = _read_int(os.path.join(d, limit_file)), _read_int(os.path.join(d, usage_file))
    if limit is not None and used is not None:
      left = max(0, limit - used)
      found = left if found is None else min(found, left)
  return found


def _status_bytes(status: str, key: str) -> Optional[int]:
  try:
    with open(status, encoding="ascii") as fh:
      for line in fh:
        if line.startswith(key + ":"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    return None
  return None


def _rlimit_left(status: str, rlimits) -> Optional[int]:
  """What `ulimit -v` (RLIMIT_AS, against VmSize) and `ulimit -d` (RLIMIT_DATA, against VmData)
  leave this process."""
  found = None
  for which, key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
    soft = rlimits(which)[0]
    if soft in (resource.RLIM_INFINITY, -1) or soft >= _NO_LIMIT:
      continue
    used = _status_bytes(status, key) or 0
    left = max(0, soft - used)
    found = left if found is None else min(found, left)
  return found


def available_bytes(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup",
                    proc_cgroup: str = "/proc/self/cgroup", status: str = "/proc/self/status",
                    rlimits=resource.getrlimit) -> Optional[int]:
  """The least that MemAvailable, this process's memory cgroup (v2 or v1) and its rlimits
  leave; None when none of them is known."""
  v2, v1 = _cgroup_paths(proc_cgroup)
  left = [_mem_available(meminfo),
          _cgroup_left(_levels(cgroup, v2), "memory.max", "memory.current"),
          _cgroup_left(_levels(os.path.join(cgroup, "memory"), v1),
                       "memory.limit_in_bytes", "memory.usage_in_bytes"),
          _rlimit_left(status, rlimits)]
  known = [n for n in left if n is not None]
  return min(known) if known else None
