"""Documentation that cannot drift from the results: `dualpath docs build` / `dualpath docs check`.

In README.md and every docs/**/*.md, the lines between `<!-- generated: NAME -->` and
`<!-- end generated -->` are written by block NAME of the registry (blocks/), from the JSONs
under docs/results/; everything outside the markers is hand-written and never touched.

1. markers.py finds the blocks of a file (a malformed marker is an error naming file and line).
2. registry.py holds {name: Block}: a function of the results it declares, the command that makes
   them; results.py lets it read only those, and a missing file or key is one error line.
3. build.py renders every block, ending each with a source line that names its JSONs and the first
   12 hex digits of their sha256, so that changing any byte of a JSON a block reads changes the
   block; `build` writes the files, `check` names the first line that differs.

Nothing imports this package but cli/docs.py (tests/core/test_imports.py).
"""
