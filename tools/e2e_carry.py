"""Assemble what the H200 machine lacks to run SGLang 0.5.12's real server, as one archive.

    python tools/e2e_carry.py [--sgl-kernel-wheel PATH]   # writes .e2e/site.tar.xz and .e2e/plugin wheel

Runs here (network); nothing is committed but this recipe. The machine's
Python 3.12 has torch 2.11.0 and much of SGLang's stack (see the device
tool's package list); what it lacks is installed for cp312 into one folder,
packed with ``tar | xz -9`` to fit the 64 MiB carry limit:

* the packages of ``tools/gpu_carry.py`` (SGLang's import set on that machine,
  flashinfer 0.6.11.post1), with starlette pinned to what fastapi 0.116
  accepts (newer fastapi imports opentelemetry);
* what the server path imports beyond the backend module: fastapi, uvicorn,
  msgspec, setproctitle, python-multipart, jsonschema and its stack, dill,
  soundfile 0.13.1 with cffi (found by importing SGLang's server modules here
  and on the machine);
* ``sglang-kernel`` 0.4.2.post2 (module ``sgl_kernel``, a 322 MB wheel) cut down
  to its ``.py`` files and ``sgl_kernel/sm90/common_ops.abi3.so``: the 1 GB
  ``flash_ops`` serves only the fa3 backend, which the test does not use;
* SGLang 0.5.12 itself (a cp311 wheel of pure Python plus one gRPC extension
  the server does not load), unzipped.

The plugin's own wheel travels beside the archive, so that the test can install
it the ways operators do, and ``libnuma.so.1`` (Debian's libnuma1, fetched
with ``apt-get download``) in ``.e2e/lib`` for machines whose image lacks it.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gpu_carry  # noqa: E402
import plugin_wheel  # noqa: E402

REPO = gpu_carry.REPO
OUT = REPO / ".e2e"
SERVER_PACKAGES = [
    "fastapi==0.116.1",
    "starlette==0.47.2",
    "uvicorn",
    "msgspec",
    "setproctitle",
    "python-multipart",
    "dill",
    "jsonschema",
    "referencing",
    "rpds-py",
    "jsonschema-specifications",
    "soundfile==0.13.1",
    "cffi",
    "pycparser",
    "interegular",
    "h11",
]
SGL_KERNEL = "sglang-kernel==0.4.2.post2"
KEEP_FROM_SGL_KERNEL = ("sgl_kernel/sm90/common_ops.abi3.so",)


def pip_target(target, specs, python_version="3.12"):
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-compile",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--target",
        str(target),
        "--upgrade",
    ]
    for platform in gpu_carry.PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + list(specs), check=True, timeout=1200)


def cut_sgl_kernel(wheel, target):
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            keep = name.startswith("sgl_kernel/") and (name.endswith(".py") or name in KEEP_FROM_SGL_KERNEL)
            # Its metadata too: SGLang's launcher checks the installed sglang-kernel version.
            if keep or (name.startswith("sglang_kernel-") and ".dist-info/" in name):
                archive.extract(name, target)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sgl-kernel-wheel", help="a downloaded %s wheel (else it is downloaded)" % SGL_KERNEL)
    arguments = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        site = scratch / "site"
        packages = [p for p in gpu_carry.PACKAGES if not p.startswith("starlette")] + SERVER_PACKAGES
        pip_target(site, packages)
        wheel = arguments.sgl_kernel_wheel
        if wheel is None:
            gpu_carry.download(SGL_KERNEL, scratch)
            wheel = next(scratch.glob("sglang_kernel-*.whl"))
        cut_sgl_kernel(wheel, site)
        gpu_carry.download("sglang==0.5.12", scratch, python_version="3.11")
        with zipfile.ZipFile(next(scratch.glob("sglang-0.5.12-*.whl"))) as archive:
            archive.extractall(site)
        subprocess.run("tar -C %s -cf - . | xz -9 -T0 > %s" % (site, OUT / "site.tar.xz"), shell=True, check=True)
    lib = OUT / "lib"
    lib.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            "apt-get download libnuma1 && dpkg -x libnuma1_*.deb x && cp -L x/usr/lib/x86_64-linux-gnu/libnuma.so.1 %s/"
            % lib,
            shell=True,
            cwd=scratch,
            check=True,
            timeout=300,
        )
    plugin_wheel.from_checkout(OUT)
    print("%s: %.1f MB" % (OUT, sum(p.stat().st_size for p in OUT.iterdir()) / 1e6))


if __name__ == "__main__":
    main()
