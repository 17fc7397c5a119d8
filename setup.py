"""Ship the startup files at the root of the wheel.

setup.cfg holds all metadata. This file exists only because setuptools has no
declarative way to place a non-module file (``sglang_hotfix_trtllm.pth`` and
its PEP 829 twin ``sglang_hotfix_trtllm.start``) at the top of site-packages:
``data_files`` would install them under the prefix instead. Copying them into
build_lib puts them in the wheel's purelib root, so pip lists them in RECORD
and ``pip uninstall`` removes them.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

STARTUP_FILES = ("sglang_hotfix_trtllm.pth", "sglang_hotfix_trtllm.start")


class BuildPyWithStartupFiles(build_py):
    def run(self):
        # A build/ folder left from an earlier build would ship modules deleted
        # since: the wheel must hold what the checkout holds, nothing more.
        for name in os.listdir(self.build_lib) if os.path.isdir(self.build_lib) else ():
            path = os.path.join(self.build_lib, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        super().run()
        for name in STARTUP_FILES:
            self.copy_file(name, os.path.join(self.build_lib, name))

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        return outputs + [os.path.join(self.build_lib, name) for name in STARTUP_FILES]


setup(cmdclass={"build_py": BuildPyWithStartupFiles})
