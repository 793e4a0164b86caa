"""`dsgraph bench` and `dsgraph generate` parse on a machine without the server's packages (the GPU
machine installs dsgraph with --no-deps and has neither uvicorn nor httpx2): the CLI imports them only
where a command runs."""

from __future__ import annotations

import subprocess
import sys

BLOCKER = """
import builtins, sys
real = builtins.__import__
def blocked(name, *args, **kwargs):
    if name.split(".")[0] in ("httpx2", "uvicorn", "fastapi", "starlette", "prometheus_client"):
        raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
    return real(name, *args, **kwargs)
builtins.__import__ = blocked
from dsgraph.tools import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_bench_and_generate_parse_without_server_packages() -> None:
    for command in (["bench", "--help"], ["generate", "--help"]):
        run = subprocess.run([sys.executable, "-c", BLOCKER, *command], capture_output=True, text=True)
        assert run.returncode == 0, (command, run.stderr[-2000:])
        assert "usage: dsgraph" in run.stdout, command
