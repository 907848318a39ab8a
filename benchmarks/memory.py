"""Memory figures of the bench: this process's resident and proportional set, the machine's
available memory, and the touched pages of the mock's HCCL windows (segments in /dev/shm)."""

from __future__ import annotations

import os
import resource


def _kb_fields(path: str, names: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in names:
                    out[key] = float(rest.split()[0])
    except OSError:
        pass
    return out


def peak_rss_mb() -> float:
    """Peak resident set of this process (VmHWM / ru_maxrss), MiB."""
    hwm = _kb_fields("/proc/self/status", ("VmHWM",)).get("VmHWM")
    kb = hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024


def pss_mb() -> float:
    """Proportional set of this process, MiB: shared pages count 1/n for each of their n mappers, so
    the sum over a world's processes is the world's memory (0 where smaps_rollup is missing)."""
    return _kb_fields("/proc/self/smaps_rollup", ("Pss",)).get("Pss", 0.0) / 1024


def available_mb() -> float:
    """MemAvailable of the machine, MiB (what new processes can still take without swapping)."""
    return _kb_fields("/proc/meminfo", ("MemAvailable",)).get("MemAvailable", 0.0) / 1024


def total_mb() -> float:
    return _kb_fields("/proc/meminfo", ("MemTotal",)).get("MemTotal", 0.0) / 1024


WINDOW_PREFIX = "aclmock_hccl_"  # the mock's segment names (unlinked once the world has formed)


def windows_mb() -> float:
    """Touched memory of the mock HCCL windows this process has mapped, MiB — every rank maps the
    whole world's windows, so this is the world's window memory: the pages of those (unlinked)
    /dev/shm segments that were written (tmpfs allocates on first touch), each segment counted once.
    NaN when /proc/self/map_files cannot be read."""
    sizes: dict[int, int] = {}
    try:
        with open("/proc/self/maps") as f:
            ranges = [line.split()[0] for line in f if WINDOW_PREFIX in line]
        for rng in ranges:
            st = os.stat(f"/proc/self/map_files/{rng}")
            sizes[st.st_ino] = st.st_blocks * 512
    except FileNotFoundError:
        pass  # unmapped meanwhile: count what was seen
    except OSError:
        return float("nan")
    return sum(sizes.values()) / 2**20
