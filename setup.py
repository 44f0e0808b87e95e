"""The one thing pyproject.toml cannot say: the example profiles (this checkout's clusters/) ship in the
wheel as the package data `launcher/examples/`, where `launch init NAME --from EXAMPLE` finds them in an
installed launch (launcher/project.py `examples_dir`). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["launcher*", "payload*"]), "launcher.examples"],
      package_dir={"launcher.examples": "clusters"})
