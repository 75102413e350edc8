"""The optional C extension readers._jpegwindow (decode only a crop window of a JPEG).

Everything else is in pyproject.toml. ``optional=True``: without a C compiler the install still
succeeds and readers.image.jpegwindow falls back to decoding the whole image (see its docstring).
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "readers._jpegwindow",
            ["csrc/jpegwindow.c"],
            include_dirs=["csrc/libjpeg-turbo"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
