"""The version (and the exact Allotment it goes with) comes from Allotment's
own pyproject.toml, two directories up: one version source for both
distributions.  Built from its sdist, it is read back from PKG-INFO."""

import os
import re
import tomllib

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = os.path.join(HERE, "..", "..", "pyproject.toml")


def version() -> str:
    if os.path.exists(MAIN):
        with open(MAIN, "rb") as handle:
            return tomllib.load(handle)["project"]["version"]
    with open(os.path.join(HERE, "PKG-INFO"), encoding="utf-8") as handle:
        return re.search(r"^Version: (\S+)$", handle.read(), re.M).group(1)


setup(version=version(), install_requires=[f"allotment=={version()}"])
