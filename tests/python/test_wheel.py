"""Checks of the INSTALLED nvshmem-efa-gda wheel (run with the Python of the venv it is installed in,
from outside the repository so that the installed package is the one imported):

    python tests/python/test_wheel.py

Needs: the wheel and nvidia-nvshmem-cu13 3.4.5 installed in that venv, libfabric reachable through
LD_LIBRARY_PATH, a C compiler (cc) for the fake NVSHMEM libraries of the refusal cases. Every case
runs in its own Python process (enable() changes the process). Plain asserts; exit status 0 when
every case passed, 1 otherwise. Also collected by pytest (test_* functions).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))


def py(code, env=None, check=True):
    """Runs code in a fresh interpreter of this venv; returns CompletedProcess (text)."""
    e = dict(os.environ)
    e.pop("NVSHMEM_HOME", None)  # the installed wheel is what these cases look for
    e.pop("NVSHMEM_REMOTE_TRANSPORT", None)
    e.pop("CUDA_MODULE_LOADING", None)
    e.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if env:
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
    r = subprocess.run([PY, "-W", "always", "-c", textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, cwd=tempfile.gettempdir())
    if check and r.returncode != 0:
        raise AssertionError(f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def cli(args, env=None):
    code = f"import sys; from nvshmem_efa_gda._cli import main; sys.exit(main({args!r}))"
    return py(code, env=env, check=False)


def served():
    return json.loads(py("import json, nvshmem_efa_gda as n; print(json.dumps(n.served_abis()))").stdout)


def fake_lib(dirpath, name, source):
    os.makedirs(dirpath, exist_ok=True)
    src = os.path.join(dirpath, name + ".c")
    with open(src, "w") as f:
        f.write(source)
    out = os.path.join(dirpath, name)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", out, src, f"-Wl,-soname,{name}"], check=True)
    return out


def fake_home(root, abi, version):
    """An NVSHMEM_HOME whose version header names `version` and transport ABI `abi`."""
    inc = os.path.join(root, "include", "non_abi")
    os.makedirs(inc, exist_ok=True)
    a, b, c = version.split(".")
    with open(os.path.join(inc, "nvshmem_version.h"), "w") as f:
        f.write(f"#define NVSHMEM_VENDOR_MAJOR_VERSION {a}\n#define NVSHMEM_VENDOR_MINOR_VERSION {b}\n"
                f"#define NVSHMEM_VENDOR_PATCH_VERSION {c}\n"
                f"#define NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION {abi}\n")
    return root


def test_served_abis_match_the_library():
    r = py("""
        import ctypes, json, nvshmem_efa_gda as n
        lib = ctypes.CDLL(n.library_path())
        buf = (ctypes.c_int * 16)()
        k = lib.nvshmem_efa_gda_served_abi_majors(buf, 16)
        ver = ctypes.CDLL(n.library_path()).nvshmem_efa_gda_version
        ver.restype = ctypes.c_char_p
        print(json.dumps({"lib": list(buf[:k]), "shims": n.served_abis(),
                          "version": ver().decode(), "pkg": n.__version__}))
    """)
    d = json.loads(r.stdout)
    assert d["lib"] == d["shims"], d
    assert 3 in d["shims"], d
    assert d["version"] == d["pkg"], d


def test_enable_picks_abi3_for_nvshmem_345_and_sets_variables():
    r = py("""
        import ctypes, json, os, nvshmem_efa_gda as n
        a = n.enable()
        # NVSHMEM's bare dlopen of the plugin name must find what enable() loaded.
        h = ctypes.CDLL("nvshmem_transport_libfabric.so.%d" % a.abi, mode=os.RTLD_NOW | os.RTLD_NOLOAD)
        assert h.nvshmemt_init
        maps = open("/proc/self/maps").read()
        b = n.enable()
        print(json.dumps({"abi": a.abi, "version": a.nvshmem.version, "source": a.nvshmem.source,
                          "rt": os.environ.get("NVSHMEM_REMOTE_TRANSPORT"),
                          "cml": os.environ.get("CUDA_MODULE_LOADING"), "set": a.env_set,
                          "shim_mapped": a.shim in maps, "same": a is b, "fabric": a.libfabric}))
    """)
    d = json.loads(r.stdout)
    assert d["abi"] == 3 and d["version"] == "3.4.5", d
    assert "nvidia-nvshmem-cu13 3.4.5" in d["source"], d
    assert d["rt"] == "libfabric" and d["cml"] == "EAGER", d
    assert d["set"] == {"NVSHMEM_REMOTE_TRANSPORT": "libfabric", "CUDA_MODULE_LOADING": "EAGER",
                        "CUDA_DEVICE_MAX_CONNECTIONS": "32"}, d
    assert d["shim_mapped"] and d["same"], d
    assert "libfabric.so" in d["fabric"], d


def test_enable_keeps_user_settings():
    r = py("""
        import os, nvshmem_efa_gda as n
        a = n.enable()
        print(os.environ["NVSHMEM_REMOTE_TRANSPORT"], os.environ["CUDA_MODULE_LOADING"],
              os.environ["CUDA_DEVICE_MAX_CONNECTIONS"], a.env_set)
    """, env={"NVSHMEM_REMOTE_TRANSPORT": "ucx", "CUDA_MODULE_LOADING": "LAZY",
             "CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert r.stdout.split()[:3] == ["ucx", "LAZY", "8"], r.stdout
    assert "{}" in r.stdout, r.stdout
    assert "NVSHMEM_REMOTE_TRANSPORT=ucx is set" in r.stderr, r.stderr


def test_enable_with_the_library_already_loaded_and_not_initialised():
    r = py("""
        import ctypes, os, nvshmem_efa_gda as n
        from importlib.metadata import distribution
        home = distribution("nvidia-nvshmem-cu13").locate_file("nvidia/nvshmem")
        ctypes.CDLL(os.path.join(str(home), "lib", "libnvshmem_host.so.3"), mode=os.RTLD_GLOBAL)
        a = n.enable()
        print(a.abi, a.nvshmem.loaded, a.nvshmem.source)
    """)
    assert r.stdout.startswith("3 True loaded, from the nvidia-nvshmem-cu13 3.4.5 wheel"), r.stdout


def test_enable_refuses_an_unserved_abi():
    s = served()
    unserved = [a for a in range(3, 8) if a not in s]
    for abi in unserved[:1]:
        r = py(f"""
            import nvshmem_efa_gda as n
            try:
                n.enable("3.{abi + 1}.0")
            except n.UnservedAbi as e:
                print("REFUSED", e)
        """)
        assert r.stdout.startswith("REFUSED"), r.stdout
        assert f"transport ABI {abi}" in r.stdout and "does not serve" in r.stdout, r.stdout
    with tempfile.TemporaryDirectory() as t:
        home = fake_home(t, 99, "3.99.0")
        r = py("""
            import os, nvshmem_efa_gda as n
            try:
                n.enable()
            except n.UnservedAbi as e:
                print("REFUSED", e)
            print("RT", os.environ.get("NVSHMEM_REMOTE_TRANSPORT"))
        """, env={"NVSHMEM_HOME": home})
        assert "REFUSED NVSHMEM 3.99.0 (NVSHMEM_HOME) uses transport ABI 99" in r.stdout, r.stdout
        assert "RT None" in r.stdout, "a refused enable() must not change the environment"
    r = py("""
        import nvshmem_efa_gda as n
        try:
            n.enable("4.0.1")
        except n.UnservedAbi as e:
            print("REFUSED", e)
    """)
    assert "REFUSED cannot tell the transport ABI of NVSHMEM 4.0.1" in r.stdout, r.stdout


def test_enable_refuses_when_nvshmem_is_initialised():
    with tempfile.TemporaryDirectory() as t:
        lib = fake_lib(os.path.join(t, "lib"), "libnvshmem_host.so.3",
                       "int nvshmemx_init_status(void) { return 2; }\n")
        r = py(f"""
            import ctypes, os, nvshmem_efa_gda as n
            ctypes.CDLL({lib!r}, mode=os.RTLD_GLOBAL)
            try:
                n.enable()
            except n.AlreadyInitialized as e:
                print("REFUSED", e)
        """)
        assert "REFUSED NVSHMEM" in r.stdout and "already initialised" in r.stdout, r.stdout
        assert "nvshmemx_init_status() = 2" in r.stdout, r.stdout
        plug = fake_lib(os.path.join(t, "other"), "nvshmem_transport_libfabric.so.3",
                        "int nvshmemt_init(void) { return 0; }\n")
        r = py(f"""
            import ctypes, os, nvshmem_efa_gda as n
            ctypes.CDLL({plug!r}, mode=os.RTLD_GLOBAL)
            try:
                n.enable()
            except n.AlreadyInitialized as e:
                print("REFUSED", e)
        """)
        assert "REFUSED another libfabric transport plugin is already loaded" in r.stdout, r.stdout


def test_enable_says_when_libfabric_is_missing():
    if os.path.exists("/opt/amazon/efa/lib/libfabric.so.1"):
        print("  (skipped: /opt/amazon/efa/lib/libfabric.so.1 exists here)")
        return
    probe = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libfabric.so.1" in probe:
        print("  (skipped: the ldconfig cache has a libfabric here)")
        return
    r = py("""
        import os, nvshmem_efa_gda as n
        try:
            n.enable()
        except n.LibfabricNotFound as e:
            print("REFUSED", e)
    """, env={"LD_LIBRARY_PATH": None})
    assert "REFUSED no usable libfabric.so.1" in r.stdout and "/opt/amazon/efa/lib" in r.stdout, r.stdout
    r = cli(["info"], env={"LD_LIBRARY_PATH": None})
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    assert "no usable libfabric.so.1" in r.stderr, r.stderr


def old_libfabric(dirpath):
    """A libfabric.so.1 that defines symbol versions FABRIC_1.0 to 1.7 only, as the 1.x releases
    Debian and Ubuntu ship (this library needs FABRIC_1.8, libfabric >= 2.0)."""
    os.makedirs(dirpath, exist_ok=True)
    script = os.path.join(dirpath, "fabric.map")
    with open(script, "w") as f:
        prev = ""
        for minor in range(8):
            f.write(f"FABRIC_1.{minor} {{ global: fi_v1_{minor}; }} {prev};\n")
            prev = f"FABRIC_1.{minor}"
    src = os.path.join(dirpath, "fabric.c")
    with open(src, "w") as f:
        f.write("".join(f"int fi_v1_{m}(void) {{ return {m}; }}\n" for m in range(8)))
    out = os.path.join(dirpath, "libfabric.so.1")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", out, src, "-Wl,-soname,libfabric.so.1",
                    f"-Wl,--version-script={script}"], check=True)
    return out


def test_an_old_libfabric_is_passed_over_and_named():
    real, _ = json.loads(py("import json, nvshmem_efa_gda as n; print(json.dumps(n.find_libfabric()))").stdout)
    assert real, "this test needs a libfabric >= 2.0 reachable as in the other cases"
    with tempfile.TemporaryDirectory() as t:
        old = old_libfabric(os.path.join(t, "old"))
        ld = os.path.join(t, "old") + ":" + os.path.dirname(real)
        # Ahead of a good one: passed over, named, and env puts the good one first.
        r = cli(["env"], env={"LD_LIBRARY_PATH": ld})
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert f"# libfabric: {os.path.realpath(real)}" in r.stdout or f"# libfabric: {real}" in r.stdout, r.stdout
        assert "lacks symbol version FABRIC_1.8" in r.stdout and os.path.realpath(old) in r.stdout, r.stdout
        assert f"export LD_LIBRARY_PATH={os.path.dirname(real)}" in r.stdout, r.stdout
        r = py("""
            import nvshmem_efa_gda as n
            a = n.enable()
            print("FABRIC", a.libfabric)
        """, env={"LD_LIBRARY_PATH": ld})
        assert "FABRIC " in r.stdout and "/old/" not in r.stdout, (r.stdout, r.stderr)
        # Alone (where no other libfabric is reachable): a refusal that names it and why.
        if os.path.exists("/opt/amazon/efa/lib/libfabric.so.1") or "libfabric.so.1" in subprocess.run(
                ["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout:
            print("  (second half skipped: another libfabric is reachable here)")
            return
        r = py("""
            import nvshmem_efa_gda as n
            try:
                n.enable()
            except n.LibfabricNotFound as e:
                print("REFUSED", e)
        """, env={"LD_LIBRARY_PATH": os.path.join(t, "old")})
        assert "REFUSED no usable libfabric.so.1" in r.stdout, (r.stdout, r.stderr)
        assert "lacks symbol version FABRIC_1.8" in r.stdout and "older than 2.0" in r.stdout, r.stdout


def test_env_prints_exports_for_launchers():
    r = cli(["env"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    pre = [ln for ln in lines if ln.startswith("export LD_PRELOAD=")]
    assert len(pre) == 1 and "/nvshmem_efa_gda/lib/nvshmem_transport_libfabric.so.3" in pre[0], lines
    assert "export NVSHMEM_REMOTE_TRANSPORT=libfabric" in lines, lines
    assert "export CUDA_MODULE_LOADING=EAGER" in lines, lines
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in lines, lines
    r2 = py("import runpy, sys; sys.argv = ['x', 'env']; runpy.run_module('nvshmem_efa_gda', run_name='__main__')",
            check=False)
    assert r2.returncode == 0 and r2.stdout == r.stdout, (r2.stdout, r2.stderr)
    with tempfile.TemporaryDirectory() as t:
        r = cli(["env"], env={"NVSHMEM_HOME": fake_home(t, 99, "3.99.0")})
        assert r.returncode == 3 and "uses transport ABI 99" in r.stderr, (r.returncode, r.stderr)


def test_info_reports_what_it_found():
    r = cli(["info"])
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    out = r.stdout
    for want in ("found via      python package nvidia-nvshmem-cu13 3.4.5", "version        3.4.5",
                 "transport ABI  3", "served         yes", "Verdict (exit 0)"):
        assert want in out, f"missing '{want}' in:\n{out}"
    shm = [ln.split() for ln in out.splitlines() if ln.strip().startswith("shm ")]
    assert shm and shm[0][1] == "yes", out
    r = cli(["info", "--json"])
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["library"]["served_abis"] == served(), d["library"]
    nv = d["nvshmem"]
    assert nv["found"] and nv["version"] == "3.4.5" and nv["abi"] == 3 and nv["served"], nv
    assert nv["host_library"].endswith("nvidia/nvshmem/lib/libnvshmem_host.so.3"), nv
    provs = {p["name"]: p for p in d["libfabric"]["providers"]}
    assert provs["shm"]["answers"] and provs["shm"]["rma"] and provs["tcp"]["answers"], provs
    assert d["gda"]["mode"] in ("hardware", "software"), d["gda"]
    assert d["exit_code"] == 0, d
    with tempfile.TemporaryDirectory() as t:
        r = cli(["info"], env={"NVSHMEM_HOME": fake_home(t, 99, "3.99.0")})
        assert r.returncode == 3, (r.returncode, r.stdout)
        assert "served         NO" in r.stdout, r.stdout
        r = cli(["info", "--json"], env={"NVSHMEM_HOME": os.path.join(t, "nothing")})
        assert r.returncode == 4, (r.returncode, r.stdout)
        assert json.loads(r.stdout)["nvshmem"]["found"] is False
    r = cli(["info", "--bogus"])
    assert r.returncode == 2, (r.returncode, r.stderr)


def test_pkgconfig_and_headers_point_into_the_package():
    r = py("import nvshmem_efa_gda as n; print(n.pkgconfig_dir()); print(n.include_dir())")
    pcdir, inc = r.stdout.split()
    out = subprocess.run(["pkg-config", "--cflags", "--libs", "nvshmem-efa-gda"],
                         env=dict(os.environ, PKG_CONFIG_PATH=pcdir), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    flags = out.stdout.split()
    for f in flags:
        if f[:2] in ("-I", "-L"):
            assert os.path.isdir(f[2:]), (f, flags)
    assert os.path.isfile(os.path.join(inc, "nvshmem_efa_gda.h"))
    assert os.path.isdir(os.path.join(inc, "nvshmem_efa_gda", "cuda"))


def main():
    tests = [(k, v) for k, v in sorted(globals().items()) if k.startswith("test_") and callable(v)]
    failed = []
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            failed.append(name)
            print(f"FAIL {name}: {e}", flush=True)
    print(f"{len(tests) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
