"""How much more memory this process may map: its ``ulimit -v`` and ``ulimit -d`` room, if any.

Under ``ulimit -v`` (``RLIMIT_AS``) an allocation fails once the process's virtual size would pass
the limit, however much physical memory is free; ``RLIMIT_DATA`` does the same for private
writable mappings (Linux 4.7+). ``mappable_bytes()`` is the smaller room of the two (limit minus
what is mapped now, from ``/proc/self/status``), or None where neither limit is set or the system
does not say. ``fits.check_fits`` takes it with the physical memory available, so a solve that
could not allocate its profiles refuses up front with the library's advice, not numpy's message.

Example:
    >>> room = mappable_bytes()
    >>> room is None or room >= 0
    True
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["mappable_bytes"]

_LIMITS = (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData"))  # limit, what it counts in /proc


def mappable_bytes() -> int | None:
    """Bytes this process may still map under its soft address-space and data limits, or None.

    ``/proc/self/status`` is read only when a limit is set (most processes have none: the small
    solves that ask before each allocation then pay one ``getrlimit`` per limit, about 1 us).
    """
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    limits = {}
    for limit_name, counted in _LIMITS:
        limit = getattr(resource, limit_name, None)
        if limit is not None:
            soft, _hard = resource.getrlimit(limit)
            if soft != resource.RLIM_INFINITY:
                limits[counted] = soft
    mapped = _mapped_bytes() if limits else {}
    rooms = [max(soft - mapped[counted], 0) for counted, soft in limits.items() if counted in mapped]
    return min(rooms) if rooms else None


def _mapped_bytes() -> dict[str, int]:
    """``VmSize`` and ``VmData`` of this process in bytes (empty where ``/proc`` is missing)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    mapped = {}
    for line in lines:
        name, _, rest = line.partition(":")
        if name in ("VmSize", "VmData") and rest.strip().endswith("kB"):
            mapped[name] = int(rest.split()[0]) * 1024
    return mapped
