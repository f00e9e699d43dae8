"""Generate the Python stubs for every ``protos/**/*.proto`` into ``services/common/protos/``.

One pinned command (``make proto``): grpcio-tools' protoc writes ``*_pb2.py`` and ``*_pb2_grpc.py``,
mypy-protobuf writes the ``.pyi`` files ``mypy --strict`` reads. Every file, ``__init__.py``
included, starts with a "generated — do not edit" header. ``--check`` regenerates in memory and
exits 1 when the committed stubs differ, which is what the test suite runs.

protoc sees ``protos/`` under the virtual path ``services/common/protos`` so the generated modules
import each other as ``services.common.protos.fatura...`` without any rewriting. A consequence: a
proto importing another of ours names it by that virtual path
(``import "services/common/protos/fatura/x/v1/y.proto";``); Google's well-known types import as usual.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos"
OUT_PACKAGE = "services/common/protos"
OUT_DIR = ROOT / OUT_PACKAGE
_GENERATED_SUFFIXES = (".py", ".pyi")
_HEADER = "# generated — do not edit: {what}. Regenerate with `make proto` (services/common/protogen.py).\n"
# grpcio ships no type information, so mypy reads the grpc stubs' overloads on grpc.Channel and
# grpc.aio.Channel as identical and their type: ignores as unused. The types still flow to callers.
_GRPC_STUB_EXTRA = "# mypy: ignore-errors\n"


class ProtogenError(RuntimeError):
    """protoc failed or found no proto files."""


def proto_files(proto_dir: Path = PROTO_DIR) -> list[Path]:
    return sorted(path.relative_to(proto_dir) for path in proto_dir.rglob("*.proto"))


def _plugin(name: str) -> str:
    # The plugins are console scripts installed beside this interpreter (the project venv).
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise ProtogenError(f"{path} is missing: install the dev extras (pip install -e '.[dev]')")
    return f"--plugin={name}={path}"


def generate(proto_dir: Path = PROTO_DIR) -> dict[str, bytes]:
    """Return {path relative to services/common/protos: file content} for every generated file."""
    protos = proto_files(proto_dir)
    if not protos:
        raise ProtogenError(f"no .proto files under {proto_dir}")
    with tempfile.TemporaryDirectory(prefix="protogen-") as tmp:
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{OUT_PACKAGE}={proto_dir}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            _plugin("protoc-gen-mypy"),
            _plugin("protoc-gen-mypy_grpc"),
            *(str(proto_dir / path) for path in protos),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ProtogenError(f"protoc failed ({done.returncode}):\n{done.stderr}")
        generated_root = Path(tmp) / OUT_PACKAGE
        files: dict[str, bytes] = {}
        for path in sorted(generated_root.rglob("*")):
            if path.is_file() and path.suffix in _GENERATED_SUFFIXES:
                relative = path.relative_to(generated_root)
                source = f"protos/{relative.parent.as_posix()}/{relative.name.split('_pb2')[0]}.proto"
                header = _HEADER.format(what=f"from {source}")
                if relative.name.endswith("_pb2_grpc.pyi"):
                    header += _GRPC_STUB_EXTRA
                files[relative.as_posix()] = header.encode() + path.read_bytes()
    packages = {Path(".")}
    for name in files:
        parent = Path(name).parent
        while parent != Path("."):
            packages.add(parent)
            parent = parent.parent
    for package in packages:
        init = (package / "__init__.py").as_posix()
        files[init] = _HEADER.format(what="package marker for the generated stubs").encode()
    return dict(sorted(files.items()))


def _existing(out_dir: Path) -> dict[str, bytes]:
    if not out_dir.exists():
        return {}
    return {
        path.relative_to(out_dir).as_posix(): path.read_bytes()
        for path in out_dir.rglob("*")
        if path.is_file() and path.suffix in _GENERATED_SUFFIXES and "__pycache__" not in path.parts
    }


def differences(wanted: dict[str, bytes], out_dir: Path) -> list[str]:
    """What regenerating would change in ``out_dir``, one line per file."""
    have = _existing(out_dir)
    lines = [f"missing: {name}" for name in wanted if name not in have]
    lines += [f"changed: {name}" for name in wanted if name in have and have[name] != wanted[name]]
    lines += [f"stale:   {name}" for name in have if name not in wanted]
    return sorted(lines)


def write(wanted: dict[str, bytes], out_dir: Path) -> list[str]:
    changes = differences(wanted, out_dir)
    for name in _existing(out_dir):
        if name not in wanted:
            (out_dir / name).unlink()
    for name, content in wanted.items():
        target = out_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() != content:
            target.write_bytes(content)
    return changes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.common.protogen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if regenerating would change the stubs")
    parser.add_argument("--protos", type=Path, default=PROTO_DIR, help="proto source root (default: protos/)")
    parser.add_argument(
        "--out", type=Path, default=OUT_DIR, help="stub directory (default: services/common/protos/)"
    )
    args = parser.parse_args(argv)
    try:
        wanted = generate(args.protos)
    except ProtogenError as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 2
    if args.check:
        changes = differences(wanted, args.out)
        for line in changes:
            print(line)
        if changes:
            print("protogen: the committed stubs are out of date; run `make proto`", file=sys.stderr)
            return 1
        print(f"protogen: {len(wanted)} generated files are up to date")
        return 0
    changes = write(wanted, args.out)
    for line in changes:
        print(line)
    print(f"protogen: {len(changes)} of {len(wanted)} generated files changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
