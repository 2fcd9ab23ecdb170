"""The ``visemz`` command, over the public API only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from . import __version__
from .errors import VisemzError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="GPU-first compression for scientific images.")


@app.command()
def version() -> None:
    """Print the visemz version."""
    typer.echo(__version__)


@app.command("ints-info")
def ints_info(path: Path) -> None:
    """Describe an ints stream written by visemz.encoders.encode_ints."""
    from .encoders import stream

    parsed = stream.parse(path.read_bytes())
    typer.echo(json.dumps({"entropy": parsed.entropy, "raw_size": parsed.raw_size, "frames": len(parsed.frames)}))


def main() -> None:
    try:
        app()
    except VisemzError as e:
        typer.echo(f"visemz: error: {e}", err=True)
        sys.exit(2)
