"""Assemble what the H200 machine lacks for the GPU proof (tests/gpu), as wheels.

    python tools/gpu_carry.py            # fills .whl/ (py3.12 wheels) and .gpu/ (SGLang's own wheel)

The device machine has Python 3.12, torch 2.11.0, numpy, tokenizers 0.23.2 and
more (see the device tool's package list), but no network: everything else
SGLang 0.5.12's backend module imports there, and flashinfer (the real
TRT-LLM decode kernel, XQA on SM90, JIT-built there with its nvcc), travels
as wheels, about 61 MB, under the 64 MiB carry limit. SGLang's own wheel is
tagged cp311: it is unzipped there rather than installed. This plugin's own
wheel is built from the checkout. Nothing here is committed but this recipe.
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_wheel  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
WHEELS = REPO / ".whl"
SGLANG_DIR = REPO / ".gpu"

# What SGLang 0.5.12's backend import needs on that machine (REFERENCE.md, "Measured here" and
# "Seen working on the H200"), plus flashinfer's decode kernel and what it imports.
PACKAGES = [
    "transformers==5.6.0",
    "tokenizers==0.22.2",
    "orjson",
    "pybase64",
    "pyzmq",
    "openai==2.6.1",
    "jiter",
    "distro",
    "sniffio",
    "partial_json_parser",
    "dill",
    "compressed-tensors",
    "loguru",
    "gguf",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types",
    "typing-inspection",
    "typing_extensions",
    "starlette",
    "ipython==9.*",
    "traitlets",
    "jedi",
    "parso",
    "pexpect",
    "ptyprocess",
    "prompt_toolkit",
    "wcwidth",
    "stack_data",
    "executing",
    "asttokens",
    "pure_eval",
    "decorator",
    "matplotlib-inline",
    "ipython-pygments-lexers",
    "flashinfer_python==0.6.11.post1",
    "apache-tvm-ffi==0.1.9",
    "cuda-tile",
    "nvidia-cudnn-frontend",
]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_31_x86_64",
    "any",
]


def download(spec, target, python_version="3.12"):
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(target),
        spec,
    ]
    for platform in PLATFORMS:
        command[4:4] = ["--platform", platform]
    subprocess.run(command, check=True, timeout=600)


def main():
    if "--release" in sys.argv[1:]:
        return main_release()
    WHEELS.mkdir(exist_ok=True)
    SGLANG_DIR.mkdir(exist_ok=True)
    for spec in PACKAGES:
        download(spec, WHEELS)
    download("sglang==0.5.12", SGLANG_DIR, python_version="3.11")
    plugin_wheel.from_checkout(WHEELS)
    total = sum(p.stat().st_size for p in list(WHEELS.iterdir()) + list(SGLANG_DIR.iterdir()))
    print("%d wheels, %.1f MB" % (len(list(WHEELS.iterdir())) + 1, total / 1e6))


# --release 0.5.10: SGLang 0.5.10 for tests/gpu/strided_query_worker.py, in folders of its own.
#
#     python tools/gpu_carry.py --release 0.5.10                  # .whl510/ and .gpu510/ (py3.12)
#     python tools/gpu_carry.py --release 0.5.10 --python-version 3.11 --out /tmp/b311   # a CPU dry run's
#
# .whl510/: what SGLang 0.5.10's backend module (and memory_pool, forward_batch_info) imports on the
# H200 beyond its image, found by importing them on CPU with CUDA hidden over only the image's
# packages, and FlashInfer as 0.5.10 pins it (0.6.7.post2: apache-tvm-ffi; its cudnn import is
# guarded and unused by XQA, cuda-tile is named by no module, pynvml, tabulate, click and ninja are
# in the image). transformers as 0.5.10 pins it (5.3.0, which wants tokenizers <= 0.23.0).
# .gpu510/: SGLang 0.5.10's own wheel (py3-none-any; unzipped there), and two builds of this
# plugin, each in its own folder (both say 0.5.0): plugin-current/ from the checkout's files,
# plugin-0.5.0/ from commit 17040a9 (the record pr28144 as released in 0.5.0).
RELEASE_PACKAGES = {
    "0.5.10": [
        "transformers==5.3.0",
        "tokenizers==0.22.2",
        "orjson",
        "pybase64",
        "pyzmq",
        "openai==2.6.1",
        "distro",
        "sniffio",
        "partial_json_parser",
        "dill",
        "compressed-tensors",
        "loguru",
        "gguf",
        "pydantic==2.14.4",
        "pydantic-core==2.50.5",
        "annotated-types",
        "typing-inspection",
        "typing_extensions",
        "starlette",
        "ipython==9.*",
        "traitlets",
        "flashinfer_python==0.6.7.post2",
        "apache-tvm-ffi==0.1.9",
    ],
}
PLUGIN_RELEASES = {"0.5.0": "17040a9"}  # folder name: commit


def build_plugin_wheel(source, target):
    """``pip wheel`` of the plugin from a copy of ``source`` (a folder), so that no build/ is left here."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = pathlib.Path(scratch, "src")
        shutil.copytree(source, copy)
        return plugin_wheel.build(copy, target)


def checkout_files(into):
    """The files that travel to the device (tracked, and untracked but not ignored), copied."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        if (REPO / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, into / name)


def commit_files(commit, into):
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def main_release():
    import argparse

    parser = argparse.ArgumentParser(prog="gpu_carry.py --release")
    parser.add_argument("--release", choices=sorted(RELEASE_PACKAGES), required=True)
    parser.add_argument("--python-version", default="3.12", help="3.12 for the H200; 3.11 for a dry run here")
    parser.add_argument("--out", type=pathlib.Path, default=REPO, help="where .whlNNN/ and .gpuNNN/ go")
    args = parser.parse_args()
    tag = args.release.replace(".", "")[1:]  # 0.5.10 -> 510
    wheels, sglang_dir = args.out / (".whl%s" % tag), args.out / (".gpu%s" % tag)
    if args.out.resolve() == REPO:
        exclude = REPO / ".git" / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        known = exclude.read_text().split() if exclude.exists() else []
        with exclude.open("a") as handle:
            for name in ("/%s/" % wheels.name, "/%s/" % sglang_dir.name):
                if name not in known:
                    handle.write(name + "\n")
    for folder in (wheels, sglang_dir):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for spec in RELEASE_PACKAGES[args.release]:
        download(spec, wheels, python_version=args.python_version)
    download("sglang==%s" % args.release, sglang_dir, python_version=args.python_version)
    with tempfile.TemporaryDirectory() as scratch:
        current = pathlib.Path(scratch, "current")
        checkout_files(current)
        build_plugin_wheel(current, sglang_dir / "plugin-current")
        for name, commit in PLUGIN_RELEASES.items():
            released = pathlib.Path(scratch, name)
            released.mkdir()
            commit_files(commit, released)
            build_plugin_wheel(released, sglang_dir / ("plugin-" + name))
    files = sorted(p for p in list(wheels.rglob("*.whl")) + list(sglang_dir.rglob("*.whl")))
    for path in files:
        print("%8.2f MB  %s" % (path.stat().st_size / 1e6, path.relative_to(args.out)))
    total = sum(p.stat().st_size for p in files)
    print("%d wheels, %.1f MB (%.1f MiB)" % (len(files), total / 1e6, total / 2**20))


if __name__ == "__main__":
    main()
