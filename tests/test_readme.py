"""Every code block of README.md runs as written.

Runnable blocks: every ```python block, and every ```bash block whose commands (lines, after joining
``\\`` continuations and dropping comments) all start with ``.venv/bin/visemz``.  Other bash blocks
(installing, the test command, torchrun, placeholders such as DATA) are shown, not run.

They run in README order, in one temporary folder (so a command may read what an earlier block wrote),
on the CPU (``VISEMZ_DEVICE=cpu``, no CUDA device visible), in one fresh Python process so that the
package is imported once: each python block with a namespace of its own (as a script would), each
``.venv/bin/visemz ARGS`` through the command's own typer app with the shell's word splitting of ARGS.
The process looks like a one-process torchrun job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LOCAL_RANK), as the README's torchrun script expects.  A block that raises or a command that exits
non-zero fails the test, naming its line in README.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ".venv/bin/visemz"
FENCE = re.compile(r"^```(\w*)\s*$")

# The runner, executed by a fresh interpreter: argv[1] is the JSON list of [kind, line, body].
RUNNER = r"""
import json, sys, traceback
steps = json.load(open(sys.argv[1]))
app = runner = None
for kind, line, body in steps:
    if kind == "python":
        try:
            exec(compile(body, f"README.md, the python block at line {line}", "exec"), {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            sys.exit(f"README.md:{line}: the python block failed")
    else:
        if app is None:
            from typer.testing import CliRunner
            from visemz.cli import app
            runner = CliRunner()
        result = runner.invoke(app, body)
        if result.exit_code != 0:
            print(result.output)
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                traceback.print_exception(result.exception)
            sys.exit(f"README.md:{line}: visemz {' '.join(body)} exited with {result.exit_code}")
    print(f"README.md:{line}: {kind} ok", flush=True)
"""


def blocks(text: str) -> list[tuple[str, int, str]]:
    """Every fenced block: (language, line of its first body line, body)."""
    found, lang, start, body = [], None, 0, []
    for n, raw in enumerate(text.splitlines(), 1):
        m = FENCE.match(raw)
        if lang is None and m:
            lang, start, body = m.group(1), n + 1, []
        elif lang is not None and raw.strip() == "```":
            found.append((lang, start, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(raw)
    assert lang is None, f"README.md: the block opened at line {start - 1} is never closed"
    return found


def commands(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, blank lines and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [c for c in (line.strip() for line in joined.splitlines()) if c and not c.startswith("#")]


def steps_of(text: str) -> list[list]:
    """The runnable steps: ["python", line, code] and ["cli", line, [args...]] in document order."""
    steps = []
    for lang, line, body in blocks(text):
        if lang == "python":
            steps.append(["python", line, body])
        elif lang == "bash" and (cmds := commands(body)) and all(c.startswith(COMMAND + " ") for c in cmds):
            steps += [["cli", line, shlex.split(c, comments=True)[1:]] for c in cmds]
    return steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_steps(steps: list, folder: Path, timeout: float = 540) -> subprocess.CompletedProcess:
    (folder / "steps.json").write_text(json.dumps(steps))
    env = dict(os.environ, VISEMZ_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT),
               RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), PYTHONWARNINGS="ignore")
    work = folder / "work"
    work.mkdir()
    return subprocess.run([sys.executable, "-c", RUNNER, str(folder / "steps.json")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_readme_has_runnable_blocks_of_both_kinds():
    steps = steps_of((ROOT / "README.md").read_text())
    kinds = [k for k, _, _ in steps]
    assert kinds.count("python") >= 5 and kinds.count("cli") >= 3, kinds
    assert any(k == "cli" and args[0] == "compress" for k, _, args in steps)


@pytest.mark.slow
@pytest.mark.timeout(600)  # every README example in one process: minutes on a loaded 2-core CPU
def test_every_readme_block_runs(tmp_path):
    steps = steps_of((ROOT / "README.md").read_text())
    r = run_steps(steps, tmp_path)
    assert r.returncode == 0, f"{r.stderr[-6000:]}\n{r.stdout[-3000:]}"
    assert r.stdout.count(": python ok") + r.stdout.count(": cli ok") == len(steps), r.stdout


BROKEN = """
```python
print("fine")
```

```bash
.venv/bin/visemz info missing.vsz
```

```python
import json
json.loads("not JSON")
```
"""


def test_a_broken_block_fails_and_is_named(tmp_path):
    steps = steps_of(BROKEN)
    assert [k for k, _, _ in steps] == ["python", "cli", "python"]
    r = run_steps(steps, tmp_path)
    assert r.returncode != 0 and "README.md:7: visemz info missing.vsz exited with 2" in r.stderr, r.stderr
    (tmp_path / "second").mkdir()
    r = run_steps(steps[2:], tmp_path / "second")
    assert r.returncode != 0 and "README.md:11: the python block failed" in r.stderr, r.stderr
    assert "JSONDecodeError" in r.stderr


@pytest.mark.parametrize("body, runnable", [
    (".venv/bin/visemz demo\n", True),
    ("# a comment\n.venv/bin/visemz compress a b \\\n    --quality 2\n", True),
    ('python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]"\n.venv/bin/visemz demo\n', False),
    ("torchrun --nproc-per-node 2 -m visemz stack f --out s.tiff\n", False),
])
def test_which_bash_blocks_run(body, runnable):
    steps = steps_of(f"```bash\n{body}```\n")
    assert bool(steps) == runnable
    if runnable and "compress" in body:
        assert steps == [["cli", 2, ["compress", "a", "b", "--quality", "2"]]]


def test_ci_installs_and_tests_as_the_readme_says():
    """.ci/run runs the README's first bash block (install, first run, tests) line by line."""
    first = next(body for lang, _, body in blocks((ROOT / "README.md").read_text()) if lang == "bash")
    wanted = [re.sub(r"\s+#.*$", "", c) for c in commands(first)]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert any("pip install" in c for c in wanted) and any("pytest" in c for c in wanted), wanted
    assert [c for c in wanted if c not in ci] == [], ci
