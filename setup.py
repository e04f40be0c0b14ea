"""Which files the wheel holds; the project's metadata is in pyproject.toml.

The packages are those under meganeura/ (found on disk, so that a new subpackage ships without
editing a list), plus `meganeura.shaders`: the top-level shaders/ folder of the repository,
mapped into the package so that an installed meganeura finds its WGSL templates next to its code
(meganeura/codegen/render.py looks there first, then in the checkout's shaders/). It is a folder
of data, not Python, which is why this cannot be said in pyproject.toml's `packages.find` alone.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["meganeura", "meganeura.*"]), "meganeura.shaders"],
    package_dir={"meganeura.shaders": "shaders"},
    package_data={"meganeura.shaders": ["*.wgsl"]},
)
