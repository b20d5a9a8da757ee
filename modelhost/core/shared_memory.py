"""Client shared-memory regions (Triton's system shared memory extension): register, use, unregister.

A region is a byte range of a POSIX shared-memory object (/dev/shm/<key>) that a client on the same host
made; the server maps it, reads inputs from it as views and writes outputs into it. Every offset and size a
client sends is checked before anything is mapped, read or written, and the object's size is read again
(fstat) before each use: a client that shrank its object after registering it gets an error, not a SIGBUS.

Contract: called on the event loop only (the front-ends), so there is no lock. A view handed out keeps its
mapping alive: unregistering a region that a running request reads from unmaps it once the request lets go.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass

from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found

SHM_DIRECTORY = "/dev/shm"
# Triton keeps keys of this prefix for its Python backend's regions and refuses them to clients; so does modelhost,
# so that a host running both cannot have one's clients map the other's internals.
RESERVED_PREFIX = "triton_python_backend_shm_region_"
FLAG = "--allow-client-shm"


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered region as Triton's status lists it."""

    name: str
    key: str
    offset: int
    byte_size: int


class Region:
    """One mapped region; `_start` is where the region begins inside its mapping (mmap offsets are aligned)."""

    __slots__ = ("status", "_map", "_start")

    def __init__(self, status: RegionStatus, mapping: mmap.mmap, start: int) -> None:
        self.status = status
        self._map = mapping
        self._start = start

    def span(self, offset: int, size: int, where: str) -> memoryview:
        """Bytes [offset, offset + size) of the region, writable; INVALID_INPUT when outside it or when the
        object behind it has shrunk past them since registration."""
        name, byte_size = self.status.name, self.status.byte_size
        # Triton's words for each case, which its QA matches; then what it means here.
        if offset < 0 or (offset >= byte_size and size > 0) or offset > byte_size:
            raise invalid(f"Invalid offset for shared memory region '{name}': {where}: offset {offset} is outside "
                          f"the region's {byte_size} bytes")
        if offset + size >= 1 << 64:
            raise invalid(f"Integer overflow detected: byte_size {size} + offset {offset} for shared memory region "
                          f"'{name}': {where}")
        if size < 0 or size > byte_size - offset:
            raise invalid(f"Invalid offset + byte size for shared memory region '{name}': {where}: offset {offset} "
                          f"and byte size {size} run past the region's {byte_size} bytes")
        end = self.status.offset + offset + size
        now = self._map.size()  # fstat: the object as it is now, not as registered
        if now < end:
            raise invalid(f"{where}: the shared memory object behind region '{name}' is now {now} bytes, too small "
                          f"for bytes up to {end}; it shrank after registration: register the region again")
        start = self._start + offset
        return memoryview(self._map)[start : start + size]

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:
            pass  # a running request still holds a view: the mapping goes when the last view does


class SharedMemory:
    """The registry of client regions, bounded by `max_regions` and `max_bytes` (their byte sizes together);
    registering is refused unless `enabled` (the operator's --allow-client-shm)."""

    def __init__(self, enabled: bool, max_regions: int, max_bytes: int, directory: str = SHM_DIRECTORY) -> None:
        self.enabled = enabled
        self._max_regions = max_regions
        self._max_bytes = max_bytes
        self._directory = directory
        self._regions: dict[str, Region] = {}
        self._bytes = 0

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_enabled()
        if not name:
            raise invalid("a shared memory region needs a name")
        if name in self._regions:
            raise ModelhostError(ErrorKind.ALREADY_EXISTS, f"shared memory region '{name}' already in manager: it "
                                 "is registered; unregister it first")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid(f"failed to register shared memory region '{name}': invalid args: {field} must be a "
                              f"non-negative integer, got {value!r}")
        if byte_size == 0:
            raise invalid(f"failed to register shared memory region '{name}': invalid args: byte_size must be at "
                          "least 1")
        if len(self._regions) >= self._max_regions:
            raise ModelhostError(ErrorKind.TOO_LARGE, f"cannot register shared memory region '{name}': "
                                 f"{self._max_regions} regions are registered, the server's limit")
        if self._bytes + byte_size > self._max_bytes:
            raise ModelhostError(ErrorKind.TOO_LARGE, f"cannot register shared memory region '{name}' of {byte_size} "
                                 f"bytes: the registered regions would exceed the server's {self._max_bytes} bytes")
        if isinstance(key, str) and key.lstrip("/").startswith(RESERVED_PREFIX):
            raise invalid(f"cannot register shared memory region '{name}' with key '{key}' as the key contains the "
                          f"reserved prefix '{RESERVED_PREFIX}'")
        status = RegionStatus(name, key, offset, byte_size)
        self._regions[name] = _map_region(status, os.path.join(self._directory, object_name(key, name)))
        self._bytes += byte_size

    def unregister(self, name: str = "") -> None:
        """One region, or every region when `name` is empty; an unknown name is no error (as Triton), nor is
        unregistering when client shared memory is off (there is none: a client's cleanup works everywhere)."""
        for region_name in [name] if name else list(self._regions):
            region = self._regions.pop(region_name, None)
            if region is not None:
                self._bytes -= region.status.byte_size
                region.close()

    def status(self, name: str = "") -> list[RegionStatus]:
        """One region's status (NOT_FOUND when unknown), or every region's when `name` is empty."""
        if not name:
            return [r.status for r in self._regions.values()]
        return [self.region(name, "status").status]

    def region(self, name: str, where: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            if not self.enabled:
                self._check_enabled()
            raise not_found(f"{where}: no shared memory region '{name}' is registered")
        return region

    def close(self) -> None:
        """At shutdown: unmap every region."""
        for region in self._regions.values():
            region.close()
        self._regions.clear()
        self._bytes = 0

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise ModelhostError(ErrorKind.PRECONDITION, "Client shared memory is disabled: the server takes shared "
                                 f"memory regions when started with {FLAG}")


def object_name(key: str, region: str = "") -> str:
    """The file name under /dev/shm of a shared-memory key as shm_open reads it (leading slashes dropped); a key
    is a name, never a path: '/', NUL (and every unprintable character), '.' and '..' in what remains are
    refused."""
    if not isinstance(key, str):
        raise invalid(f"shared memory key must be a string, got {type(key).__name__}")
    name = key.lstrip("/")
    if not name or "/" in name or not name.isprintable() or name in (".", "..") or len(name.encode()) > 255:
        registering = f"cannot register shared memory region '{region}' - invalid shm key {key!r}: " if region else ""
        raise invalid(f"{registering}shared memory key {key!r} is not the name of a shared memory object "
                      "('/name': one name of at most 255 bytes, without '/' or control characters, not '.' or '..')")
    return name


def _map_region(status: RegionStatus, path: str) -> Region:
    name, key = status.name, status.key
    try:
        # O_NOFOLLOW: a symlink in /dev/shm pointing elsewhere is refused; O_NONBLOCK: a FIFO cannot stall us.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise invalid(f"Unable to open shared memory region: '{key}': no shared memory object has that key "
                      f"(region '{name}')") from None
    except OSError as exc:
        raise invalid(f"shared memory region '{name}': the server cannot open the shared memory object "
                      f"with key '{key}' for reading and writing ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise invalid(f"shared memory region '{name}': key '{key}' is not a shared memory object")
        end = status.offset + status.byte_size
        if end > info.st_size:
            raise invalid(f"failed to register shared memory region '{name}': invalid args: offset {status.offset} "
                          f"and byte_size {status.byte_size} run past the end of shared memory object '{key}' of "
                          f"{info.st_size} bytes")
        start = status.offset - status.offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(fd, end - start, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
    except (OSError, ValueError) as exc:  # ValueError: mmap's own size check, should the object shrink meanwhile
        raise invalid(f"shared memory region '{name}': cannot map shared memory object '{key}' "
                      f"({getattr(exc, 'strerror', None) or exc})") from None
    finally:
        os.close(fd)  # the mapping keeps its own descriptor (mmap.size() reads the object's size through it)
    return Region(status, mapping, status.offset - start)
