"""The hotfixes this package carries. Standard library only."""

from . import pr25103, pr26521, pr28144, pr31667

HOTFIXES = (pr26521.HOTFIX, pr25103.HOTFIX, pr28144.HOTFIX, pr31667.HOTFIX)


def for_module(module_name):
    return [hotfix for hotfix in HOTFIXES if hotfix.module == module_name]
