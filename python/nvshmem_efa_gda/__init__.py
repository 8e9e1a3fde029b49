"""nvshmem-efa-gda for Python: make the NVSHMEM in this process use the library as its remote
transport, without LD_PRELOAD.

    import nvshmem_efa_gda
    nvshmem_efa_gda.enable()      # before NVSHMEM initialises (nvshmem.core.init, torch symm. memory)

enable() finds the NVSHMEM of this process (already loaded, else NVSHMEM_HOME, else the installed
nvidia-nvshmem-cu12/-cu13 wheel), maps its release to NVSHMEM's transport ABI major (3.4 -> 3,
3.5 -> 4, 3.6 -> 5, 3.7 -> 6, 3.8 -> 7), loads this package's nvshmem_transport_libfabric.so.<ABI>
with RTLD_GLOBAL (its SONAME is that name, so NVSHMEM's dlopen of the name reuses it), and sets
NVSHMEM_REMOTE_TRANSPORT=libfabric, CUDA_MODULE_LOADING=EAGER and CUDA_DEVICE_MAX_CONNECTIONS=32 unless
they are set (the last two before CUDA starts: lazy module loading and streams sharing a few hardware
queues can each leave this library's copies waiting behind a kernel that waits for them).

For launchers: `python -m nvshmem_efa_gda env` prints the equivalent shell exports (LD_PRELOAD).
"""

import ctypes
import os
import re
import subprocess
import threading
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

__all__ = [
    "enable",
    "Activation",
    "NvshmemEfaGdaError",
    "NvshmemNotFound",
    "UnservedAbi",
    "AlreadyInitialized",
    "LibfabricNotFound",
    "NvshmemInfo",
    "find_nvshmem",
    "served_abis",
    "abi_for_release",
    "env_exports",
    "find_libfabric",
    "package_dir",
    "lib_dir",
    "include_dir",
    "cmake_dir",
    "pkgconfig_dir",
    "library_path",
    "shim_path",
    "program_path",
    "__version__",
]

_PKG = os.path.dirname(os.path.abspath(__file__))
SHIM_PREFIX = "nvshmem_transport_libfabric.so."
EFA_LIBDIR = "/opt/amazon/efa/lib"
NVSHMEM_DISTS = ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12")


def _dist_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvshmem-efa-gda")
    except Exception:  # running from the source tree
        return "unknown"


__version__ = _dist_version()


class NvshmemEfaGdaError(RuntimeError):
    """Base of the errors enable() raises; the message says what to do."""


class NvshmemNotFound(NvshmemEfaGdaError):
    pass


class UnservedAbi(NvshmemEfaGdaError):
    pass


class AlreadyInitialized(NvshmemEfaGdaError):
    pass


class LibfabricNotFound(NvshmemEfaGdaError):
    pass


# Paths inside the installed package.
def package_dir() -> str:
    return _PKG


def lib_dir() -> str:
    return os.path.join(_PKG, "lib")


def include_dir() -> str:
    return os.path.join(_PKG, "include")


def cmake_dir() -> str:
    """Give to CMAKE_PREFIX_PATH (find_package(NvshmemEfaGda))."""
    return _PKG


def pkgconfig_dir() -> str:
    return os.path.join(lib_dir(), "pkgconfig")


def library_path() -> str:
    return os.path.join(lib_dir(), "libnvshmem_efa_gda.so")


def shim_path(abi: int) -> str:
    return os.path.join(lib_dir(), SHIM_PREFIX + str(int(abi)))


def program_path() -> str:
    return os.path.join(_PKG, "bin", "nvshmem-efa-gda")


def served_abis() -> List[int]:
    """NVSHMEM transport ABI majors this installation serves: one plugin shim per ABI."""
    out = []
    try:
        names = os.listdir(lib_dir())
    except OSError:
        return out
    for n in names:
        if n.startswith(SHIM_PREFIX) and n[len(SHIM_PREFIX):].isdigit():
            out.append(int(n[len(SHIM_PREFIX):]))
    return sorted(out)


def abi_for_release(version: str) -> Optional[int]:
    """NVSHMEM release -> transport ABI major: 3.4 -> 3, 3.5 -> 4, 3.6 -> 5, 3.7 -> 6, 3.8 -> 7;
    None for a release whose ABI is not known here."""
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    if not m:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    if major == 3 and 4 <= minor <= 8:
        return minor - 1
    return None


def _release_of_abi(abi: int) -> str:
    return f"NVSHMEM 3.{abi + 1}.x"


@dataclass
class NvshmemInfo:
    """The NVSHMEM enable() works with."""

    source: str  # how it was found
    version: Optional[str]
    abi: Optional[int]
    host_library: Optional[str] = None
    home: Optional[str] = None
    loaded: bool = False


def _maps() -> List[str]:
    try:
        with open("/proc/self/maps") as f:
            return [ln.split(None, 5)[5].strip() for ln in f if len(ln.split(None, 5)) == 6]
    except OSError:
        return []


def _mapped(prefix: str) -> List[str]:
    seen = []
    for p in _maps():
        if os.path.basename(p).startswith(prefix) and p not in seen:
            seen.append(p)
    return seen


def _read_version_header(home: str) -> Tuple[Optional[str], Optional[int]]:
    """(release, transport ABI major) from <home>/include/non_abi/nvshmem_version.h."""
    path = os.path.join(home, "include", "non_abi", "nvshmem_version.h")
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None, None

    def d(name):
        m = re.search(r"^#define\s+" + name + r"\s+(\d+)", text, re.M)
        return int(m.group(1)) if m else None

    parts = [d("NVSHMEM_VENDOR_MAJOR_VERSION"), d("NVSHMEM_VENDOR_MINOR_VERSION"),
             d("NVSHMEM_VENDOR_PATCH_VERSION")]
    version = ".".join(map(str, parts)) if None not in parts else None
    return version, d("NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION")


def _host_lib_in(d: str) -> Optional[str]:
    try:
        libs = sorted(n for n in os.listdir(d) if n.startswith("libnvshmem_host.so"))
    except OSError:
        return None
    return os.path.join(d, libs[0]) if libs else None


def _installed_dists() -> List[Tuple[str, str, str]]:
    """(dist name, version, nvidia/nvshmem directory) of the NVSHMEM wheels installed."""
    out = []
    try:
        from importlib.metadata import PackageNotFoundError, distribution
    except ImportError:  # Python < 3.8
        return out
    for name in NVSHMEM_DISTS:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        home = str(dist.locate_file(os.path.join("nvidia", "nvshmem")))
        out.append((name, dist.version, home))
    return out


def _from_home(home: str, source: str, version: Optional[str] = None) -> NvshmemInfo:
    hv, habi = _read_version_header(home)
    lib = _host_lib_in(os.path.join(home, "lib")) or _host_lib_in(home)
    if lib is None and hv is None and version is None:
        raise NvshmemNotFound(
            f"{source}: {home} holds neither lib/libnvshmem_host.so* nor "
            "include/non_abi/nvshmem_version.h"
        )
    v = hv or version
    abi = habi if habi is not None else abi_for_release(v or "")
    return NvshmemInfo(source=source, version=v, abi=abi, host_library=lib, home=home)


def find_nvshmem(nvshmem_home: Optional[str] = None, nvshmem_version: Optional[str] = None,
                 abi: Optional[int] = None) -> NvshmemInfo:
    """The NVSHMEM this process uses, in this order: an explicit argument (abi, nvshmem_version,
    nvshmem_home), the libnvshmem_host already loaded in this process, NVSHMEM_HOME, the installed
    nvidia-nvshmem-cu13 / -cu12 wheel."""
    loaded = _mapped("libnvshmem_host.so")
    if abi is not None:
        return NvshmemInfo(source="argument abi", version=nvshmem_version, abi=int(abi),
                           host_library=loaded[0] if loaded else None, loaded=bool(loaded))
    if nvshmem_version is not None:
        a = abi_for_release(nvshmem_version)
        return NvshmemInfo(source="argument nvshmem_version", version=nvshmem_version, abi=a,
                           host_library=loaded[0] if loaded else None, loaded=bool(loaded))
    if nvshmem_home is not None:
        n = _from_home(nvshmem_home, "argument nvshmem_home")
        n.loaded = bool(loaded)
        return n
    dists = _installed_dists()
    if loaded:
        lib = loaded[0]
        libdir = os.path.dirname(lib)
        for name, ver, home in dists:
            if os.path.realpath(os.path.join(home, "lib")) == os.path.realpath(libdir):
                hv, habi = _read_version_header(home)
                return NvshmemInfo(source=f"loaded, from the {name} {ver} wheel",
                                   version=ver, abi=habi if habi is not None else abi_for_release(ver),
                                   host_library=lib, home=home, loaded=True)
        n = _from_home(os.path.dirname(libdir), "loaded")
        n.host_library, n.loaded = lib, True
        return n
    env_home = os.environ.get("NVSHMEM_HOME")
    if env_home:
        return _from_home(env_home, "NVSHMEM_HOME")
    if dists:
        abis = {abi_for_release(v) for _, v, _ in dists}
        if len(abis) > 1:
            raise NvshmemNotFound(
                "several NVSHMEM wheels with different ABIs are installed ("
                + ", ".join(f"{n} {v}" for n, v, _ in dists)
                + "): pass enable(nvshmem_version=...) or set NVSHMEM_HOME"
            )
        name, ver, home = dists[0]
        hv, habi = _read_version_header(home)
        return NvshmemInfo(source=f"the {name} {ver} wheel", version=ver,
                           abi=habi if habi is not None else abi_for_release(ver),
                           host_library=_host_lib_in(os.path.join(home, "lib")), home=home)
    raise NvshmemNotFound(
        "no NVSHMEM found: none loaded in this process, NVSHMEM_HOME unset, and neither "
        + " nor ".join(NVSHMEM_DISTS)
        + " installed; install one (pip install nvidia-nvshmem-cu12) or set NVSHMEM_HOME"
    )


_FABRIC_VERSION = re.compile(rb"FABRIC_(\d+)\.(\d+)\x00")


def _fabric_versions(path: str) -> set:
    """The libfabric symbol versions (FABRIC_x.y) named in a shared object's version sections: what a
    libfabric.so defines, or what this library needs. Read from the file, never by loading it (a
    loaded libfabric.so.1 of the wrong release would be the one every later lookup gets)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return set()
    return {(int(a), int(b)) for a, b in _FABRIC_VERSION.findall(data)}


def _needed_fabric_versions() -> set:
    return _fabric_versions(library_path())


def _ldconfig_libfabric() -> List[str]:
    for tool in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([tool, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return [ln.split("=>", 1)[1].strip() for ln in out.splitlines()
                if ln.strip().startswith("libfabric.so.1 ") and "=>" in ln]
    return []


def _libfabric_candidates() -> List[str]:
    """Every libfabric.so.1 in the order the dynamic loader tries them for this library:
    LD_LIBRARY_PATH, its RUNPATH (the EFA installer's directory), the ldconfig cache."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + [EFA_LIBDIR]
    seen, out = set(), []
    for c in [os.path.join(d, "libfabric.so.1") for d in dirs] + _ldconfig_libfabric():
        real = os.path.realpath(c)
        if os.path.exists(c) and real not in seen:
            seen.add(real)
            out.append(c)
    return out


def _too_old(path: str, need: set) -> Optional[str]:
    """Why the libfabric at `path` cannot serve this library (None: it can)."""
    have = _fabric_versions(path)
    missing = sorted(need - have)
    if not need or not missing:
        return None
    newest = max(have) if have else None
    return (f"{os.path.realpath(path)} lacks symbol version "
            + ", ".join(f"FABRIC_{a}.{b}" for a, b in missing)
            + (f" (it stops at FABRIC_{newest[0]}.{newest[1]}: a libfabric older than 2.0)"
               if newest else ""))


def find_libfabric(load: bool = False) -> Tuple[Optional[str], List[str]]:
    """Where libfabric.so.1 comes from: (path or None, places looked at and why each was passed
    over). Already loaded in this process, else the first libfabric >= 2.0 in the loader's order
    (LD_LIBRARY_PATH, the EFA installer's /opt/amazon/efa/lib, the ldconfig cache); a libfabric
    that lacks the symbol versions this library needs (an older release, such as Debian's or
    Ubuntu's 1.x) is passed over and named. With load=True the library found is loaded by its full
    path (RTLD_GLOBAL), so the plugin's own lookup of libfabric.so.1 gets that one."""
    looked = ["this process", "LD_LIBRARY_PATH=" + os.environ.get("LD_LIBRARY_PATH", ""),
              EFA_LIBDIR, "the ldconfig cache"]
    need = _needed_fabric_versions()
    mapped = _mapped("libfabric.so")
    if mapped:
        why = _too_old(mapped[0], need)
        if why is None:
            return mapped[0], looked
        return None, looked + ["already loaded in this process: " + why]
    rejected = []
    for cand in _libfabric_candidates():
        why = _too_old(cand, need)
        if why is not None:
            rejected.append(why)
            continue
        try:
            ctypes.CDLL(cand, mode=os.RTLD_NOW | (os.RTLD_GLOBAL if load else os.RTLD_LOCAL))
        except OSError as e:
            rejected.append(f"{cand}: {e}")
            continue
        found = _mapped("libfabric.so")
        return (found[0] if found else cand), looked + rejected
    return None, looked + rejected


def _no_libfabric_message(looked: List[str]) -> str:
    return (
        "no usable libfabric.so.1 (looked in: " + "; ".join(looked) + "). nvshmem-efa-gda uses the "
        "system's libfabric (>= 2.0) and does not bundle one: install the AWS EFA installer "
        "(it puts libfabric in /opt/amazon/efa/lib) or a libfabric >= 2.0, and add its "
        "lib directory to LD_LIBRARY_PATH before starting Python."
    )


def _init_status(host_lib: str) -> Optional[int]:
    """nvshmemx_init_status() of the NVSHMEM already loaded (0 = not initialised), or None when it
    cannot be asked."""
    try:
        h = ctypes.CDLL(host_lib, mode=os.RTLD_NOW | os.RTLD_NOLOAD)
        f = h.nvshmemx_init_status
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_int
    f.argtypes = []
    return int(f())


@dataclass
class Activation:
    """What enable() did."""

    abi: int
    nvshmem: NvshmemInfo
    shim: str
    library: str
    libfabric: str
    env_set: Dict[str, str] = field(default_factory=dict)
    env_kept: Dict[str, str] = field(default_factory=dict)


_lock = threading.Lock()
_active: Optional[Activation] = None


def enable(nvshmem_version: Optional[str] = None, *, nvshmem_home: Optional[str] = None,
           abi: Optional[int] = None) -> Activation:
    """Makes the NVSHMEM of this process use nvshmem-efa-gda as its libfabric remote transport.

    Call it before NVSHMEM initialises. Raises NvshmemNotFound, UnservedAbi, AlreadyInitialized or
    LibfabricNotFound (all NvshmemEfaGdaError) with a message that says what to do. Calling it again
    for the same ABI returns the first activation.
    """
    global _active
    with _lock:
        nv = find_nvshmem(nvshmem_home=nvshmem_home, nvshmem_version=nvshmem_version, abi=abi)
        if _active is not None:
            if _active.abi == nv.abi:
                return _active
            raise NvshmemEfaGdaError(
                f"enable() already loaded the ABI {_active.abi} plugin; a process holds one NVSHMEM"
            )
        if nv.loaded and nv.host_library:
            status = _init_status(nv.host_library)
            if status is None:
                warnings.warn(
                    f"{nv.host_library} is already loaded and its nvshmemx_init_status cannot be "
                    "asked: if NVSHMEM is already initialised, enable() comes too late",
                    RuntimeWarning, stacklevel=2)
            elif status != 0:
                raise AlreadyInitialized(
                    f"NVSHMEM ({nv.host_library}) is already initialised (nvshmemx_init_status() = "
                    f"{status}): it chose its transports at initialisation; call "
                    "nvshmem_efa_gda.enable() before NVSHMEM initialises (before nvshmem.core.init, "
                    "torch's symmetric memory rendezvous, or any import that initialises NVSHMEM)"
                )
        foreign = [p for p in _mapped(SHIM_PREFIX) if os.path.dirname(p) != lib_dir()]
        if foreign:
            raise AlreadyInitialized(
                f"another libfabric transport plugin is already loaded ({foreign[0]}): NVSHMEM "
                "initialised with its own; call enable() before NVSHMEM initialises"
            )
        served = served_abis()
        if nv.abi is None:
            raise UnservedAbi(
                f"cannot tell the transport ABI of NVSHMEM {nv.version or '(unknown version)'} "
                f"({nv.source}): known releases are 3.4 to 3.8; pass enable(abi=N) if you know it"
            )
        if nv.abi not in served:
            raise UnservedAbi(
                f"NVSHMEM {nv.version or ''} ({nv.source}) uses transport ABI {nv.abi}, which this "
                f"nvshmem-efa-gda {__version__} does not serve (it serves "
                + ", ".join(f"ABI {a} = {_release_of_abi(a)}" for a in served)
                + "): install a served NVSHMEM release or an nvshmem-efa-gda that serves it"
            )
        fabric, looked = find_libfabric(load=True)
        if fabric is None:
            raise LibfabricNotFound(_no_libfabric_message(looked))

        env_set, env_kept = {}, {}
        want = {"NVSHMEM_REMOTE_TRANSPORT": "libfabric"}
        if os.environ.get("NVSHMEM_EFA_CUDA_MODULE_LOADING", "").strip().lower() != "keep":
            want["CUDA_MODULE_LOADING"] = "EAGER"
        if os.environ.get("NVSHMEM_EFA_CUDA_MAX_CONNECTIONS", "").strip().lower() != "keep":
            want["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
        for k, v in want.items():
            if k in os.environ:
                env_kept[k] = os.environ[k]
            else:
                os.environ[k] = v  # also putenv(): NVSHMEM and CUDA read the C environment
                env_set[k] = v
        rt = env_kept.get("NVSHMEM_REMOTE_TRANSPORT")
        if rt is not None and rt.strip().lower() != "libfabric":
            warnings.warn(
                f"NVSHMEM_REMOTE_TRANSPORT={rt} is set: kept, so NVSHMEM will not use "
                "nvshmem-efa-gda (unset it or set it to libfabric)", RuntimeWarning, stacklevel=2)
        cuda_vars = [k for k in ("CUDA_MODULE_LOADING", "CUDA_DEVICE_MAX_CONNECTIONS") if k in env_set]
        if cuda_vars and _mapped("libcuda.so"):
            warnings.warn(
                "CUDA is already loaded in this process: " + " and ".join(
                    f"{k}={env_set[k]}" for k in cuda_vars) + " apply only if CUDA has not been "
                "initialised yet (otherwise this library's GPU copies on software providers can "
                "deadlock behind a waiting kernel; see docs/nvshmem-transport.md): call enable() before torch or "
                "CUDA start", RuntimeWarning, stacklevel=2)

        shim = shim_path(nv.abi)
        try:
            ctypes.CDLL(shim, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except OSError as e:
            raise NvshmemEfaGdaError(f"cannot load {shim}: {e}") from e
        # NVSHMEM opens the bare name: it must resolve to what was just loaded (SONAME match).
        try:
            again = ctypes.CDLL(SHIM_PREFIX + str(nv.abi), mode=os.RTLD_NOW | os.RTLD_NOLOAD)
            again.nvshmemt_init  # noqa: B018 - the entry point NVSHMEM looks up
        except (OSError, AttributeError) as e:
            raise NvshmemEfaGdaError(
                f"loaded {shim} but dlopen('{SHIM_PREFIX}{nv.abi}') does not resolve to it: {e}"
            ) from e
        _active = Activation(abi=nv.abi, nvshmem=nv, shim=shim, library=library_path(),
                             libfabric=fabric, env_set=env_set, env_kept=env_kept)
        return _active


def env_exports(nvshmem_version: Optional[str] = None, *, nvshmem_home: Optional[str] = None,
                abi: Optional[int] = None) -> List[str]:
    """The shell lines that give a launched process what enable() gives this one (LD_PRELOAD of
    the matching plugin shim). Raises like enable() when NVSHMEM is not found or not served."""
    nv = find_nvshmem(nvshmem_home=nvshmem_home, nvshmem_version=nvshmem_version, abi=abi)
    served = served_abis()
    if nv.abi is None or nv.abi not in served:
        raise UnservedAbi(
            f"NVSHMEM {nv.version or '(unknown version)'} ({nv.source}) uses transport ABI "
            f"{nv.abi if nv.abi is not None else '(unknown)'}; this nvshmem-efa-gda serves "
            + ", ".join(f"ABI {a} = {_release_of_abi(a)}" for a in served)
        )
    lines = [
        f"# nvshmem-efa-gda {__version__} for NVSHMEM {nv.version or ''} (transport ABI {nv.abi}, "
        f"{nv.source})",
        f"export LD_PRELOAD={shim_path(nv.abi)}${{LD_PRELOAD:+:$LD_PRELOAD}}",
    ]
    if "NVSHMEM_REMOTE_TRANSPORT" not in os.environ:
        lines.append("export NVSHMEM_REMOTE_TRANSPORT=libfabric")
    if "CUDA_MODULE_LOADING" not in os.environ:
        lines.append("export CUDA_MODULE_LOADING=EAGER")
    if "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=32")
    fabric, looked = find_libfabric()
    if fabric is None:
        lines.append("# WARNING: " + _no_libfabric_message(looked))
    else:
        lines.append(f"# libfabric: {fabric}")
        passed_over = [w for w in looked if "lacks symbol version" in w]
        if passed_over:
            # The launched process's loader would meet the old one first: put this one ahead.
            lines.append("# passed over: " + "; ".join(passed_over))
            d = os.path.dirname(fabric)
            lines.append(f"export LD_LIBRARY_PATH={d}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
    return lines
