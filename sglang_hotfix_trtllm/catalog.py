"""The hotfixes this package carries. Standard library only."""

from . import pr26521

HOTFIXES = (pr26521.HOTFIX,)


def for_module(module_name):
    return [hotfix for hotfix in HOTFIXES if hotfix.module == module_name]
