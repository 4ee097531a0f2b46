"""`dualpath docs build | check`: the generated blocks of README.md and docs/**/*.md (docs/build.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InputError

docs_app = typer.Typer(add_completion=False, no_args_is_help=True,
                       help="The generated blocks of README.md and docs/**/*.md, from docs/results/**/*.json.")

RootOption = Annotated[Optional[Path], typer.Option("--root", help="repository root (default: found from the current "
                                                                   "directory)")]


def repo_root(root: Optional[Path]) -> Path:
    """--root as given (it must hold docs/results), else the nearest folder at or above the current
    directory with pyproject.toml and docs/."""
    if root is not None:
        if not (root / "docs" / "results").is_dir():
            raise InputError(f"--root {root}: no docs/results folder there")
        return root
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "docs" / "results").is_dir():
            return d
    raise InputError(f"no repository root (pyproject.toml and docs/results) at or above {here}; pass --root DIR")


@docs_app.command("build")
def build(root: RootOption = None) -> None:
    """Rewrite every generated block from the results JSONs; text outside the markers is kept."""
    from ..docs.build import build as build_docs

    outcome, written = build_docs(repo_root(root))
    typer.echo(f"{outcome.num_blocks} blocks, {outcome.num_jsons} JSONs: "
               + (f"wrote {', '.join(written)}" if written else "nothing to write"))


@docs_app.command("check")
def check(root: RootOption = None) -> None:
    """Exit 1 naming the first line a build would change; 0 when every block is up to date."""
    from ..docs.build import first_difference, render

    outcome = render(repo_root(root))
    diff = first_difference(outcome)
    if diff is None:
        typer.echo(f"{outcome.num_blocks} blocks, {outcome.num_jsons} JSONs: up to date")
        return
    typer.echo(f"{diff.file}:{diff.line}: generated block '{diff.block}' is not what `dualpath docs build` "
               f"writes\n  committed: {diff.committed}\n  build:     {diff.built}", err=True)
    raise typer.Exit(1)
