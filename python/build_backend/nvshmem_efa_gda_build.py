"""PEP 517 build backend of the nvshmem-efa-gda wheel (in-tree, no build dependencies).

The wheel is not a Python extension: it carries a C-ABI shared library, the per-ABI NVSHMEM plugin
shims compiled from cmake/plugin_shim.c, a Rust command-line program, C/CUDA headers and the CMake and
pkg-config files. build_wheel therefore runs exactly what a source install runs (cargo build --release,
then cmake/install.sh into a staging prefix) and packs that prefix into nvshmem_efa_gda/ next to the
pure-Python package. Afterwards it:
  - strips debug info and sets RUNPATHs that hold no build path: the library and the program look for
    libfabric.so.1 in LD_LIBRARY_PATH, then /opt/amazon/efa/lib (the EFA installer's), then the
    ldconfig cache; the shims keep $ORIGIN (they find the library next to them);
  - rewrites the pkg-config prefix to ${pcfiledir}/../.. (the CMake package is relocatable already);
  - refuses to pack a file that still names the build tree;
  - tags the wheel manylinux_2_<N>_<arch>, N = the newest GLIBC_2.N symbol version any ELF file in it
    requires (readelf -V), and checks that the ELF files need nothing beyond glibc, libgcc_s and
    libfabric.so.1 (libfabric is the system's, on purpose; see docs/python.md).

Environment: CARGO (default cargo), CARGO_TARGET_DIR (as cargo), CC (for the shims),
NVSHMEM_EFA_GDA_SKIP_CARGO=1 (use an existing target/release build as is).
"""

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "nvshmem_efa_gda"
DIST = "nvshmem-efa-gda"
EFA_LIBDIR = "/opt/amazon/efa/lib"
# DT_NEEDED entries allowed in the wheel: glibc's libraries (manylinux policy), libgcc_s, the
# system libfabric, and the library itself (needed by the shims).
ALLOWED_NEEDED = re.compile(
    r"^(libc|libm|libdl|libpthread|librt|libgcc_s|libresolv|libutil)\.so\.\d+$|"
    r"^ld-linux-[\w-]+\.so\.\d+$|^libfabric\.so\.1$|^libnvshmem_efa_gda\.so$"
)


def _log(msg):
    print("[nvshmem-efa-gda build] " + msg, file=sys.stderr, flush=True)


def _run(cmd, **kw):
    _log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kw)


def _out(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        in_pkg = False
        for line in f:
            s = line.strip()
            if s.startswith("["):
                in_pkg = s == "[package]"
            elif in_pkg:
                m = re.match(r'version\s*=\s*"([^"]+)"', s)
                if m:
                    return m.group(1)
    raise RuntimeError("no [package] version in Cargo.toml")


def _target_dir(cargo):
    import json

    meta = json.loads(_out([cargo, "metadata", "--format-version", "1", "--no-deps",
                            "--manifest-path", os.path.join(ROOT, "Cargo.toml")]))
    return meta["target_directory"]


def _is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _glibc_needed(path):
    """Newest GLIBC_2.N version the file requires (from the version-needs section)."""
    text = _out(["readelf", "-V", "-W", path])
    vers = [int(m) for m in re.findall(r"Name: GLIBC_2\.(\d+)", text)]
    return max(vers) if vers else 0


def _needed(path):
    return re.findall(r"\(NEEDED\).*\[(.+?)\]", _out(["readelf", "-d", "-W", path]))


def _runpath(path):
    m = re.search(r"\((?:RUNPATH|RPATH)\).*\[(.*?)\]", _out(["readelf", "-d", "-W", path]))
    return m.group(1) if m else None


def _arch():
    m = os.uname().machine
    if m not in ("x86_64", "aarch64"):
        raise RuntimeError(f"unsupported machine {m}")
    return m


def _build_tree(stage):
    """cargo build + cmake/install.sh into stage/prefix; returns (prefix, program path)."""
    cargo = os.environ.get("CARGO", "cargo")
    target = _target_dir(cargo)
    if os.environ.get("NVSHMEM_EFA_GDA_SKIP_CARGO") != "1":
        _run([cargo, "build", "--release", "--locked", "--lib", "--bin", "nvshmem-efa-gda"], cwd=ROOT)
    release = os.path.join(target, "release")
    prefix = os.path.join(stage, "prefix")
    env = dict(os.environ, PREFIX=prefix)
    _run(["bash", os.path.join(ROOT, "cmake", "install.sh"), "--build-dir", release], env=env,
         stdout=subprocess.DEVNULL)
    return prefix, os.path.join(release, "nvshmem-efa-gda")


def _fix_elf(path, runpath):
    _run(["objcopy", "--strip-debug", path])
    if runpath is None:
        _run(["patchelf", "--remove-rpath", path])
    else:
        _run(["patchelf", "--set-rpath", runpath, path])


def _assemble(stage):
    """Lays out the wheel's tree in stage/wheel; returns (tree, glibc minor)."""
    prefix, program = _build_tree(stage)
    tree = os.path.join(stage, "wheel")
    pkg = os.path.join(tree, NAME)
    shutil.copytree(os.path.join(ROOT, "python", NAME), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for sub in ("lib", "include"):
        shutil.copytree(os.path.join(prefix, sub), os.path.join(pkg, sub), symlinks=False)
    os.makedirs(os.path.join(pkg, "bin"))
    shutil.copy2(program, os.path.join(pkg, "bin", "nvshmem-efa-gda"))

    libdir = os.path.join(pkg, "lib")
    _fix_elf(os.path.join(libdir, "libnvshmem_efa_gda.so"), "$ORIGIN:" + EFA_LIBDIR)
    _fix_elf(os.path.join(pkg, "bin", "nvshmem-efa-gda"), EFA_LIBDIR)
    shims = sorted(f for f in os.listdir(libdir) if f.startswith("nvshmem_transport_libfabric.so."))
    if not shims:
        raise RuntimeError("cmake/install.sh built no nvshmem_transport_libfabric.so.N shim")
    for s in shims:
        _fix_elf(os.path.join(libdir, s), "$ORIGIN")

    pc = os.path.join(libdir, "pkgconfig", "nvshmem-efa-gda.pc")
    with open(pc) as f:
        text = f.read()
    text = re.sub(r"^prefix=.*$", "prefix=${pcfiledir}/../..", text, count=1, flags=re.M)
    with open(pc, "w") as f:
        f.write(text)

    glibc = 0
    for dirpath, _, files in os.walk(tree):
        for fn in files:
            p = os.path.join(dirpath, fn)
            with open(p, "rb") as f:
                data = f.read()
            for bad in (prefix, stage, ROOT, os.path.realpath(ROOT)):
                if bad.encode() in data and not _is_elf(p):
                    raise RuntimeError(f"{p} names the build tree ({bad})")
            if _is_elf(p):
                rp = _runpath(p)
                if rp not in ("$ORIGIN:" + EFA_LIBDIR, EFA_LIBDIR, "$ORIGIN"):
                    raise RuntimeError(f"{p}: unexpected RUNPATH {rp}")
                for n in _needed(p):
                    if not ALLOWED_NEEDED.match(n):
                        raise RuntimeError(f"{p} needs {n}, which the wheel may not assume")
                glibc = max(glibc, _glibc_needed(p))
    return tree, glibc


def _metadata(version):
    readme = ""
    try:
        with open(os.path.join(ROOT, "python", "README.md")) as f:
            readme = f.read()
    except OSError:
        pass
    head = (
        "Metadata-Version: 2.1\n"
        f"Name: {DIST}\n"
        f"Version: {version}\n"
        "Summary: NVSHMEM remote transport and GPU-initiated EFA queues over libfabric "
        "(library, NVSHMEM plugin shims, headers, enable() for Python)\n"
        "License: BSD-3-Clause\n"
        "Requires-Python: >=3.8\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Programming Language :: Python :: 3\n"
    )
    if readme:
        head += "Description-Content-Type: text/markdown\n\n" + readme
    return head


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arc, f"sha256={digest}", str(len(data))]


def _write_wheel(tree, wheel_dir, version, tag):
    distinfo = f"{NAME}-{version}.dist-info"
    wheel_name = f"{NAME}-{version}-{tag}.whl"
    extra = {
        f"{distinfo}/METADATA": _metadata(version),
        f"{distinfo}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: nvshmem_efa_gda_build\nRoot-Is-Purelib: false\n"
            f"Tag: {tag}\n"
        ),
        f"{distinfo}/entry_points.txt": (
            "[console_scripts]\nnvshmem-efa-gda = nvshmem_efa_gda._cli:main\n"
        ),
    }
    lic = os.path.join(ROOT, "LICENSE")
    if os.path.exists(lic):
        with open(lic) as f:
            extra[f"{distinfo}/LICENSE"] = f.read()
    records = []
    path = os.path.join(wheel_dir, wheel_name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for dirpath, dirs, files in os.walk(tree):
            dirs.sort()
            for fn in sorted(files):
                p = os.path.join(dirpath, fn)
                arc = os.path.relpath(p, tree).replace(os.sep, "/")
                with open(p, "rb") as f:
                    data = f.read()
                info = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
                mode = 0o755 if os.access(p, os.X_OK) else 0o644
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
                records.append(_record_line(arc, data))
        for arc, text in extra.items():
            data = text.encode()
            info = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            records.append(_record_line(arc, data))
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerows(records)
        w.writerow([f"{distinfo}/RECORD", "", ""])
        info = zipfile.ZipInfo(f"{distinfo}/RECORD", date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = (0o100644) << 16
        z.writestr(info, buf.getvalue())
    return wheel_name


# PEP 517 hooks.
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    with tempfile.TemporaryDirectory(prefix="nvshmem-efa-gda-wheel-") as stage:
        tree, glibc = _assemble(stage)
        if glibc == 0:
            raise RuntimeError("no GLIBC symbol versions found: cannot choose a manylinux tag")
        tag = f"py3-none-manylinux_2_{glibc}_{_arch()}"
        _log(f"newest GLIBC symbol version required: 2.{glibc} -> {tag}")
        name = _write_wheel(tree, wheel_directory, version, tag)
    _log(f"wrote {os.path.join(wheel_directory, name)}")
    return name


def build_sdist(sdist_directory, config_settings=None):
    """The tracked files of the repository (git ls-files) plus PKG-INFO."""
    version = _version()
    base = f"{NAME}-{version}"
    files = _out(["git", "-C", ROOT, "ls-files", "-z"]).split("\0")
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in files:
            p = os.path.join(ROOT, rel)
            if rel and os.path.isfile(p) and not os.path.islink(p):
                t.add(p, arcname=f"{base}/{rel}")
        data = _metadata(version).encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
