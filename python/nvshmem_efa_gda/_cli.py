"""The `nvshmem-efa-gda` command (console script) and `python -m nvshmem_efa_gda`.

    nvshmem-efa-gda info [--json] [...]   runs the Rust program shipped in the wheel
                                          (bin/nvshmem-efa-gda), telling it which NVSHMEM wheel
                                          Python sees when NVSHMEM_HOME does not say
    nvshmem-efa-gda env [--abi N | --nvshmem-version X.Y | --nvshmem-home DIR]
                                          prints shell exports for launchers (LD_PRELOAD etc.)
    nvshmem-efa-gda paths                 prints where the library, shims, headers, CMake and
                                          pkg-config files are

Exit codes of info: those of the program (0 ready, 1 no libfabric provider answers, 2 bad usage,
3 NVSHMEM's ABI not served, 4 no NVSHMEM found) and 5 when libfabric.so.1 cannot be found at all.
env exits 3 when NVSHMEM's ABI is not served, 4 when no NVSHMEM is found.
"""

import os
import subprocess
import sys

from . import (NvshmemNotFound, UnservedAbi, _installed_dists, _no_libfabric_message, cmake_dir,
               env_exports, find_libfabric, include_dir, lib_dir, library_path, pkgconfig_dir,
               program_path, served_abis, shim_path)

USAGE = "usage:\n" + __doc__.split("\n\n")[1]


def _info(args):
    fabric, looked = find_libfabric()
    if fabric is None:
        print("nvshmem-efa-gda: " + _no_libfabric_message(looked), file=sys.stderr)
        return 5
    prog = program_path()
    if not os.access(prog, os.X_OK):
        print(f"nvshmem-efa-gda: {prog} is missing or not executable: reinstall the wheel",
              file=sys.stderr)
        return 2
    extra = []
    if "--nvshmem-home" not in args and not os.environ.get("NVSHMEM_HOME"):
        dists = _installed_dists()
        if dists:
            name, ver, home = dists[0]
            extra = ["--nvshmem-home", home, "--nvshmem-version", ver,
                     "--nvshmem-source", f"python package {name} {ver}"]
    env = dict(os.environ)
    # The program links libfabric.so.1; its RUNPATH has /opt/amazon/efa/lib. A libfabric found
    # elsewhere by this process (already loaded) is handed over through LD_LIBRARY_PATH.
    d = os.path.dirname(fabric)
    if d and d not in env.get("LD_LIBRARY_PATH", "").split(":"):
        env["LD_LIBRARY_PATH"] = d + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return subprocess.call([prog, "info", *args, *extra], env=env)


def _env(args):
    kw = {}
    it = iter(args)
    for a in it:
        try:
            if a == "--abi":
                kw["abi"] = int(next(it))
            elif a == "--nvshmem-version":
                kw["nvshmem_version"] = next(it)
            elif a == "--nvshmem-home":
                kw["nvshmem_home"] = next(it)
            else:
                print(f"nvshmem-efa-gda env: unknown argument '{a}'\n\n{USAGE}", file=sys.stderr)
                return 2
        except (StopIteration, ValueError):
            print(f"nvshmem-efa-gda env: {a} needs a value\n\n{USAGE}", file=sys.stderr)
            return 2
    try:
        lines = env_exports(**kw)
    except UnservedAbi as e:
        print(f"nvshmem-efa-gda env: {e}", file=sys.stderr)
        return 3
    except NvshmemNotFound as e:
        print(f"nvshmem-efa-gda env: {e}", file=sys.stderr)
        return 4
    print("\n".join(lines))
    return 0


def _paths():
    print(f"library     {library_path()}")
    for a in served_abis():
        print(f"shim ABI {a}  {shim_path(a)}")
    print(f"lib dir     {lib_dir()}")
    print(f"include     {include_dir()}")
    print(f"cmake       CMAKE_PREFIX_PATH={cmake_dir()}")
    print(f"pkg-config  PKG_CONFIG_PATH={pkgconfig_dir()}")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "info":
        return _info(rest)
    if cmd == "env":
        return _env(rest)
    if cmd == "paths":
        return _paths()
    if cmd in ("-V", "--version"):
        from . import __version__

        print(f"nvshmem-efa-gda {__version__}")
        return 0
    print(f"nvshmem-efa-gda: unknown command '{cmd}'\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
