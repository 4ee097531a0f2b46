"""Compile the simulator's hot path with mypyc, in place (`make compiled`), or remove it (--clean).

    python tools/compile_sim.py [--clean | --auto | --list] [--src DIR] [--opt-level 0-3]

Needs mypy (in the `test` extra of pyproject.toml, pinned), Python's headers and a C compiler.
`--auto` is the set-up's step (`make demo`, `make test`): it builds where a C compiler is found and
otherwise, or when the build fails, leaves pure Python in place with one line saying why.
`--list` prints the compiled sources (the Makefile rebuilds when one changes). The module list and
the freshness check live in src/dualpath/_build.py; this script writes the stamp that check reads.
It loads `_build.py` by path, so a stale build does not stop it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
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


def c_compiler() -> str | None:
    """The C compiler setuptools would call (sysconfig's CC, else cc / gcc / clang on PATH)."""
    configured = (sysconfig.get_config_var("CC") or "").split()
    for name in configured[:1] + ["cc", "gcc", "clang"]:
        if shutil.which(name):
            return name
    return None


def auto(src: Path, opt_level: str) -> None:
    """Build in a child process, its output kept unless it fails; pure Python stays otherwise."""
    b = _load_build_module(src)
    cc = c_compiler()
    if cc is None:
        clean(b)
        print("simulator: no C compiler found, so it runs as pure Python (about 3x slower; with gcc, `make compiled`)")
        return
    child = subprocess.run([sys.executable, __file__, "--src", str(src), "--opt-level", opt_level],
                           capture_output=True, text=True)
    if child.returncode != 0:
        clean(b)
        tail = (child.stderr or child.stdout).strip().splitlines()[-1:] or ["no output"]
        print(f"simulator: the compiled build failed ({tail[0]}), so it runs as pure Python")
        return
    print(f"simulator: compiled with mypyc by {cc} ({len(b.COMPILED_MODULES)} modules)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=REPO_SRC, help="the src/ folder to build in (default: this repo's)")
    ap.add_argument("--opt-level", default="3", choices=["0", "1", "2", "3"],
                    help="the C compiler's -O level (default 3; the identity test builds at 0, ~2x faster to compile, "
                         "with the same generated code)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--clean", action="store_true", help="remove the compiled modules and the stamp")
    mode.add_argument("--auto", action="store_true", help="build if a C compiler is present; else, or on failure, pure Python")
    mode.add_argument("--list", action="store_true", help="print the compiled sources, one a line, relative to the repository")
    args = ap.parse_args()
    src = args.src.resolve()
    b = _load_build_module(src)
    if args.list:
        print("\n".join(str((src / m).relative_to(src.parent)) for m in b.COMPILED_MODULES))
    elif args.auto:
        auto(src, args.opt_level)
    elif args.clean:
        print(f"removed {clean(b)} compiled modules")
    else:
        build(b, src, args.opt_level)


if __name__ == "__main__":
    main()
