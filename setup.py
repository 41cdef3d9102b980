"""Builds the optional C layer-tap callback; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "localpers._taps", sources=["localpers/_taps.c"], optional=True, extra_compile_args=["-O2"]
        ),
    ]
)
