"""Packaging for vllm-rocm-aiter-plugin.

``install_requires`` is deliberately empty: the plugin runs inside an existing vLLM environment
(typically a ROCm vLLM image) and must never replace its vLLM or torch. numpy, which the split uses,
is a dependency of every vLLM release.
"""

import os

from setuptools import find_packages, setup

_here = os.path.dirname(os.path.abspath(__file__))
_version: dict[str, str] = {}
with open(os.path.join(_here, "vllm_rocm_aiter_plugin", "_version.py")) as f:
    exec(f.read(), _version)

with open(os.path.join(_here, "README.md")) as f:
    _long_description = f.read()

setup(
    name="vllm-rocm-aiter-plugin",
    version=_version["__version__"],
    description=(
        "vLLM plugin for AMD ROCm: a corrected ROCM_AITER_FA metadata builder and extend path "
        "(the EAGLE crash of vLLM 0.20-0.23, the cached context model-runner V2's batch order "
        "makes stock ignore, NaN from empty context chunks)"
    ),
    long_description=_long_description,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_rocm_aiter_plugin", "vllm_rocm_aiter_plugin.*"]),
    install_requires=[],
    entry_points={
        "vllm.general_plugins": ["vllm_rocm_aiter_plugin = vllm_rocm_aiter_plugin:register"],
        "vllm.platform_plugins": [
            "vllm_rocm_aiter_plugin = vllm_rocm_aiter_plugin:platform_plugin"
        ],
        "console_scripts": ["vllm-rocm-aiter-plugin = vllm_rocm_aiter_plugin.diagnostics.cli:main"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: POSIX :: Linux",
    ],
)
