"""What this machine can give a launch, read before anything is launched (torch-free except for the
CUDA count): free host memory (``MemAvailable``, capped by the cgroup's limit), the CUDA GPUs and
their free memory (``nvidia-smi``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
# The torch runtime of one rank, outside what the engine predicts and the runner measures: the RSS
# of a process that imported torch and the runner was 0.26 GiB here (autopar.runner.memory's notes
# give 0.3-0.5 GB); a CUDA context costs about as much on the GPU.
RUNTIME_BYTES_PER_RANK = int(0.3 * GIB)
_UNLIMITED = 2**60


@dataclass(frozen=True)
class HostMemory:
    available: int  # bytes a new process can still use
    source: str  # where the figure comes from, for messages


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _cgroup_free(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes left under this process's cgroup memory limit (v2 or v1), None when unlimited or unknown."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    best: int | None = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2
            dirs = [root / rel, root]
            files = ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            dirs = [root / "memory" / rel, root / "memory"]
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        for d in dirs:  # inside a container the cgroup's own directory may be the mounted root
            limit, used = _read_int(d / files[0]), _read_int(d / files[1])
            if limit is not None and used is not None:
                if limit < _UNLIMITED:
                    free = max(limit - used, 0)
                    best = free if best is None else min(best, free)
                break
    return best


def host_memory() -> HostMemory:
    """Free host memory: /proc/meminfo's MemAvailable (psutil or sysconf elsewhere), capped by the cgroup."""
    avail: int | None = None
    source = "MemAvailable"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        avail = None
    if avail is None:
        try:
            import psutil

            avail, source = int(psutil.virtual_memory().available), "psutil"
        except ImportError:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            source = "free pages"
    cg = _cgroup_free()
    if cg is not None and cg < avail:
        return HostMemory(cg, "the cgroup's memory limit")
    return HostMemory(avail, source)


def cuda_device_count() -> int:
    """CUDA GPUs torch can use here (0 without torch or CUDA); creates no CUDA context.

    Without an NVIDIA or AMD device node and without ``nvidia-smi`` there is none, and torch (seconds
    to import) is not asked.
    """
    nodes = any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists()
    if not nodes and shutil.which("nvidia-smi") is None:
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def gpu_free_bytes() -> list[int] | None:
    """Free memory of each visible GPU (``nvidia-smi``, honouring numeric CUDA_VISIBLE_DEVICES), or None."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        free = [int(float(x)) * 2**20 for x in out.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None and vis.strip():
        try:
            free = [free[int(i)] for i in vis.split(",")]
        except (ValueError, IndexError):
            return None
    return free
