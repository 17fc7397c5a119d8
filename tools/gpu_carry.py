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
    WHEELS.mkdir(exist_ok=True)
    SGLANG_DIR.mkdir(exist_ok=True)
    for spec in PACKAGES:
        download(spec, WHEELS)
    download("sglang==0.5.12", SGLANG_DIR, python_version="3.11")
    for old in WHEELS.glob("sglang_hotfix_trtllm-*.whl"):
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(WHEELS), str(REPO)],
        check=True,
        timeout=300,
    )
    shutil.rmtree(REPO / "build", ignore_errors=True)
    total = sum(p.stat().st_size for p in list(WHEELS.iterdir()) + list(SGLANG_DIR.iterdir()))
    print("%d wheels, %.1f MB" % (len(list(WHEELS.iterdir())) + 1, total / 1e6))


if __name__ == "__main__":
    main()
