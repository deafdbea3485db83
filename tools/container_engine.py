"""The container engine the image test builds and runs on: its client, a dockerd for the run, the base image.

    python -m tools.container_engine base-image

prints the base image to build deploy/Dockerfile on (``PYTHON_IMAGE``): the Dockerfile's default when the
engine has it or can pull it, else the one made from Debian's packages (``DEBIAN_BASE``), made once with
mmdebstrap and kept by the engine for the next runs. Nothing but the standard library: CI runs this with
the system's python3 before the project's venv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# Debian's own client: a newer `docker` elsewhere on the PATH may demand the buildx plugin, which Debian lacks.
DEBIAN_CLIENT = Path("/usr/bin/docker")
# A dockerd started here: no bridge network and no iptables rules; containers and builds use the host network.
DOCKERD_FLAGS = ("--bridge=none", "--iptables=false")
DEBIAN_BASE = "local/python:3.11-bookworm"
DEBIAN_BASE_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates,passwd"
DEBIAN_SUITE = "bookworm"
ENGINE_START_SECONDS = 60.0
PULL_SECONDS = 300.0
MMDEBSTRAP_SECONDS = 900.0


class EngineUnavailable(Exception):
    """No container engine can run here; the message says why and what would make one run."""


def client() -> str | None:
    """The docker client to use: Debian's when installed, else the one on the PATH."""
    if os.access(DEBIAN_CLIENT, os.X_OK):
        return str(DEBIAN_CLIENT)
    return shutil.which("docker")


def docker(*args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One docker command; output captured. ``check``: a non-zero exit raises with its output."""
    path = client()
    if path is None:
        raise EngineUnavailable("No docker client is installed (Debian: apt-get install docker.io, or make docker).")
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    result = subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"`docker {' '.join(args[:2])}` exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result


def answers() -> bool:
    """Whether an engine answers the client."""
    return _refusal() is None


def _refusal() -> str | None:
    """Why no engine answers the client (its last line of error), or None when one does."""
    try:
        result = docker("version", "--format", "{{.Server.Version}}", timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "the engine did not answer `docker version` within 20 s"
    if result.returncode == 0:
        return None
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"`docker version` exited {result.returncode}"


def _dockerd() -> str | None:
    for candidate in (shutil.which("dockerd"), "/usr/sbin/dockerd", "/usr/bin/dockerd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def running_engine(log_path: Path) -> Iterator[bool]:
    """An engine for the block: the one running, else a dockerd started now (root only) and stopped after.

    Yields whether this started it. Raises :class:`EngineUnavailable` when none runs and none can start.
    """
    if client() is None:
        raise EngineUnavailable("No docker client is installed (Debian: apt-get install docker.io, or make docker).")
    refusal = _refusal()
    if refusal is None:
        yield False
        return
    if "permission denied" in refusal.lower():
        raise EngineUnavailable(
            f"The engine refuses this user ({refusal}): add the user to the `docker` group, or run as root."
        )
    dockerd = _dockerd()
    if dockerd is None:
        raise EngineUnavailable(f"No container engine answers ({refusal}) and dockerd is not installed (make docker).")
    if os.geteuid() != 0:
        raise EngineUnavailable(
            f"No container engine answers ({refusal}) and only root can start dockerd: start it (systemctl start "
            "docker), or run the tests as root."
        )
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [dockerd, *DOCKERD_FLAGS], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + ENGINE_START_SECONDS
    while not answers():
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process)
            raise EngineUnavailable(f"dockerd {' '.join(DOCKERD_FLAGS)} did not start:\n{_tail(log_path)}")
        time.sleep(0.2)
    # Ours, unless another dockerd came up meanwhile (ours then exits, refusing to start beside it).
    started = process.poll() is None
    try:
        yield started
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def default_base() -> str:
    """The Dockerfile's own ``ARG PYTHON_IMAGE=...``."""
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{DOCKERFILE.relative_to(ROOT)} has no `ARG PYTHON_IMAGE=...` default")
    return match.group(1)


def has_image(name: str) -> bool:
    return docker("image", "inspect", name, timeout=30, check=False).returncode == 0


def base_image(say: bool = True) -> str:
    """The Dockerfile's default base when present or pullable, else the Debian-made one (made once)."""
    default = default_base()
    if has_image(default):
        return default
    with contextlib.suppress(subprocess.TimeoutExpired):
        if docker("pull", "--quiet", default, timeout=PULL_SECONDS, check=False).returncode == 0:
            return default
    with _lock("debian-base"):
        if not has_image(DEBIAN_BASE):
            if say:
                print(f"{default} cannot be pulled: making {DEBIAN_BASE} from Debian's packages", file=sys.stderr)
            make_debian_base()
    return DEBIAN_BASE


def make_debian_base() -> None:
    """mmdebstrap's minimal Debian with Python, imported as ``DEBIAN_BASE`` (about a minute, once per engine)."""
    mmdebstrap = shutil.which("mmdebstrap") or "/usr/bin/mmdebstrap"
    if not os.access(mmdebstrap, os.X_OK):
        raise RuntimeError(
            f"{default_base()} cannot be pulled and mmdebstrap, which makes the base from Debian's packages "
            "instead, is not installed (make docker)."
        )
    with tempfile.TemporaryDirectory(prefix="debian-base-") as folder:
        tarball = Path(folder) / "base.tar"
        command = [
            mmdebstrap,
            "--quiet",
            "--variant=minbase",
            f"--include={DEBIAN_BASE_PACKAGES}",
            DEBIAN_SUITE,
            str(tarball),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=MMDEBSTRAP_SECONDS, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"mmdebstrap could not make the base image:\n{result.stderr[-3000:]}")
        docker("import", str(tarball), DEBIAN_BASE, timeout=300)


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """One process at a time makes the base (two test runs at once would both run mmdebstrap)."""
    path = Path(tempfile.gettempdir()) / f"saas-jobs-inbox-{name}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.container_engine", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["base-image"])
    parser.parse_args(argv)
    if not answers():
        print("No container engine answers: start dockerd first.", file=sys.stderr)
        return 1
    print(base_image())
    return 0


if __name__ == "__main__":
    sys.exit(main())
