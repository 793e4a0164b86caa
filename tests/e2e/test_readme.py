"""The README's snippets run: every Python block (the client block against our server on a free loopback
port), every curl line against that server, and every other `dsgraph` command line parses with the real
CLI (the GPU and long-running ones are not run here). Links point at files in the repository."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.cli import build_parser
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import serving

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)
PYTHON = [body for lang, body in BLOCKS if lang == "python"]
SHELL = [body for lang, body in BLOCKS if lang == "sh"]


@pytest.fixture(scope="module")
def url():  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=256, max_num_seqs=4))
    with serving(create_app(engine, root.name, recipe_tokenizer(root))) as base:
        yield base


def _here(text: str, url: str) -> str:
    return text.replace("http://127.0.0.1:8000", url).replace("localhost:8000", url.removeprefix("http://"))


def _commands(body: str) -> list[str]:
    """Shell commands of a block, continuation lines joined, comments and `&` dropped (curl blocks,
    whose JSON spans lines, are run as scripts instead)."""
    if body.lstrip().startswith("curl"):
        return ["curl"]
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip().removesuffix("&").strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def test_the_readme_has_the_blocks_this_test_runs() -> None:
    assert len(PYTHON) == 3 and any("from dsgraph import LLM" in b for b in PYTHON)
    assert any("Session.from_checkpoint(" in b for b in PYTHON)  # the Session API snippet
    assert sum(b.count("curl ") for b in SHELL) >= 7


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_blocks_run(index: int, url: str) -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    exec(compile(_here(PYTHON[index], url), f"README.md python block {index}", "exec"), {})


def test_curl_blocks_run(url: str) -> None:
    blocks = [b for b in SHELL if b.lstrip().startswith("curl")]
    assert blocks
    for body in blocks:  # as a script, so quoted JSON may span lines; every request must succeed
        script = 'set -e -o pipefail\ncurl() { command curl --fail "$@"; }\n' + _here(body, url)
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "dsgraph_requests" in done.stdout, done.stderr
        assert done.stdout.count('"object"') >= 3 and "text_completion" in done.stdout


def test_every_other_command_parses() -> None:
    parser = build_parser()
    seen = 0
    for body in SHELL:
        for cmd in _commands(body):
            argv = shlex.split(cmd)
            if argv[0] in (".venv/bin/dsgraph", "bin/dsgraph"):
                parser.parse_args(argv[1:])  # argparse exits on an unknown flag or a bad choice
                seen += 1
            elif argv[0] == ".venv/bin/python":
                assert argv[1:3] == ["-m", "dsgraph.tools.bench.{linear,moe,attn}_sweep"] or argv[1] == "-m"
            else:
                assert argv[0] in ("curl", "bin/test"), cmd
    assert seen >= 12


def test_links_point_into_the_repository() -> None:
    assert "../shared" not in README
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        assert (REPO / target).exists(), target
    for path in re.findall(r"`((?:docs|runtime|models|tools|tests)/[\w/.-]+\.(?:py|md))`", README):
        assert (REPO / path).exists(), path
