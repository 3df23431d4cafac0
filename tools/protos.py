"""Generate the Python stubs for protos/ into gen/, or check that gen/ is current.

    python -m tools.protos generate   # rewrite gen/versus from protos/
    python -m tools.protos check      # exit 1 if gen/versus differs from a fresh generation

Generation uses the exact grpcio-tools and mypy-protobuf versions pinned in
pyproject.toml, so the output is byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
GEN_ROOT = ROOT / "gen"
PACKAGE = "versus"

_INIT_TEXT = '"""Generated from protos/ by `make protos`. Do not edit."""\n'


def _well_known_include() -> Path:
    import grpc_tools

    return Path(grpc_tools.__file__).resolve().parent / "_proto"


def _plugin(name: str) -> str:
    scripts = Path(sysconfig.get_path("scripts"))
    candidate = scripts / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"protoc plugin {name} not found; install the dev extras (make venv)")
    return found


def generate(proto_root: Path, out_root: Path) -> None:
    """Generate `<out_root>/versus/...` from every .proto under `proto_root`."""
    protos = sorted(p.relative_to(proto_root).as_posix() for p in proto_root.rglob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {proto_root}")
    pkg_dir = out_root / PACKAGE
    if pkg_dir.exists():
        shutil.rmtree(pkg_dir)
    out_root.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{_well_known_include()}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    # mypy-protobuf narrates every file it writes on stderr; only show output on failure.
    done = subprocess.run(cmd, cwd=proto_root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"protoc failed:\n{done.stdout}{done.stderr}")
    # protoc writes modules only; make every directory a regular typed package.
    for directory in [pkg_dir, *sorted(d for d in pkg_dir.rglob("*") if d.is_dir())]:
        (directory / "__init__.py").write_text(_INIT_TEXT)
    (pkg_dir / "py.typed").write_text("")


def _tree(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def diff_trees(expected: Path, actual: Path) -> list[str]:
    """Describe how `actual` differs from `expected`; empty when identical."""
    want, have = _tree(expected), _tree(actual)
    problems = [f"missing: {name}" for name in sorted(want.keys() - have.keys())]
    problems += [f"unexpected: {name}" for name in sorted(have.keys() - want.keys())]
    for name in sorted(want.keys() & have.keys()):
        if not filecmp.cmp(want[name], have[name], shallow=False):
            delta = difflib.unified_diff(
                have[name].read_text().splitlines(),
                want[name].read_text().splitlines(),
                f"committed/{name}",
                f"generated/{name}",
                lineterm="",
                n=1,
            )
            problems.append(f"stale: {name}\n" + "\n".join(list(delta)[:20]))
    return problems


def check(proto_root: Path, committed_root: Path) -> list[str]:
    """Regenerate into a scratch directory and compare with `committed_root/versus`."""
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        generate(proto_root, fresh)
        return diff_trees(fresh / PACKAGE, committed_root / PACKAGE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["generate", "check"])
    args = parser.parse_args(argv)
    if args.action == "generate":
        generate(PROTO_ROOT, GEN_ROOT)
        return 0
    problems = check(PROTO_ROOT, GEN_ROOT)
    if problems:
        print("generated stubs in gen/ are stale; run `make protos` and commit the result:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print("generated stubs are current")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
