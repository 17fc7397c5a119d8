"""Real FlashInfer releases from the package index, reduced to the files the hotfix reads of an
installed FlashInfer (its package's ``__init__.py`` and ``prefill.py``, fmha_v2's warp-specialised
``dma.h``, the dist-info's METADATA and RECORD): a folder to put on a process's PYTHONPATH so that ``status``
judges that FlashInfer. Cached under ``.cache/flashinfer/<version>``."""

import pathlib
import subprocess
import sys
import tempfile
import zipfile

from conftest import CACHE, exclusive

KEPT = (
    "flashinfer/__init__.py",
    "flashinfer/prefill.py",
    "flashinfer/data/csrc/fmha_v2/fmha/warpspec/dma.h",
)


def flashinfer_dir(version):
    folder = CACHE / "flashinfer" / version
    marker = folder / ".complete"
    with exclusive("flashinfer-" + version):
        if marker.exists():
            return folder
        with tempfile.TemporaryDirectory() as download:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--quiet",
                    "-d",
                    download,
                    "flashinfer-python==" + version,
                ],
                check=True,
            )
            (wheel,) = pathlib.Path(download).glob("flashinfer_python-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if member in KEPT or member.endswith((".dist-info/METADATA", ".dist-info/RECORD")):
                        target = folder / member
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(archive.read(member))
        marker.write_text(version)
    return folder
