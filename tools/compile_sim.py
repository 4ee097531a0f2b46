"""Compile the simulator's hot path with mypyc, in place (`make compiled`), or remove it (--clean).

    python tools/compile_sim.py [--clean] [--src DIR] [--opt-level 0-3]

Needs mypy (in the `test` extra of pyproject.toml, pinned) and a C compiler. The module list and the
freshness check live in src/dualpath/_build.py; this script writes the stamp that check reads.
It loads `_build.py` by path, so a stale build does not stop it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO_SRC = Path(__file__).resolve().parent.parent / "src"


def _load_build_module(src: Path):
    spec = importlib.util.spec_from_file_location("_dualpath_build", src / "dualpath" / "_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def clean(b) -> int:
    removed = b.extension_files()
    for p in removed:
        p.unlink()
    b.STAMP_PATH.unlink(missing_ok=True)
    return len(removed)


def build(b, src: Path, opt_level: str = "3") -> None:
    try:
        from mypyc.build import mypycify
        from setuptools import setup
    except ImportError as e:
        sys.exit(f"compile_sim: {e.name} is missing; install the test extra: pip install -e '.[test]'")
    clean(b)
    os.chdir(src)  # build_ext --inplace puts dualpath/sim/x.so beside dualpath/sim/x.py
    build_dir = tempfile.mkdtemp(prefix="dualpath-mypyc-")
    try:
        exts = mypycify(["--ignore-missing-imports", *b.COMPILED_MODULES], opt_level=opt_level, group_name=b.GROUP_NAME,
                        target_dir=os.path.join(build_dir, "c"))
        setup(name="dualpath-compiled", ext_modules=exts,
              script_args=["-q", "build_ext", "--inplace", "--build-temp", os.path.join(build_dir, "tmp"),
                           "--build-lib", os.path.join(build_dir, "lib")])
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    stamp = {"sources": {m: b.source_digest(m) for m in b.COMPILED_MODULES},
             "python": sys.version.split()[0], "extensions": [str(p.relative_to(src)) for p in b.extension_files()]}
    b.STAMP_PATH.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    print(f"compiled {len(b.COMPILED_MODULES)} modules; stamp {b.STAMP_PATH}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clean", action="store_true", help="remove the compiled modules and the stamp")
    ap.add_argument("--src", type=Path, default=REPO_SRC, help="the src/ folder to build in (default: this repo's)")
    ap.add_argument("--opt-level", default="3", choices=["0", "1", "2", "3"],
                    help="the C compiler's -O level (default 3; the identity test builds at 0, ~2x faster to compile, "
                         "with the same generated code)")
    args = ap.parse_args()
    src = args.src.resolve()
    b = _load_build_module(src)
    if args.clean:
        print(f"removed {clean(b)} compiled modules")
    else:
        build(b, src, args.opt_level)


if __name__ == "__main__":
    main()
