"""Build the evaluator images: `python images/build.py [NAME ...] [--base auto|public|offline]`.

One folder per image under images/ holds its Dockerfile (which takes its base image as the build
argument BASE) and offline-packages.txt (the Debian packages its offline base needs).

- public base: the Dockerfile's default BASE (python:3.11-slim, gcc:13, pytorch/pytorch), pulled
  from a registry;
- offline base: Debian bookworm bootstrapped here with `debootstrap --variant=minbase
  --include=<offline-packages.txt>` from Debian's package mirror (no container registry needed),
  packed as .cache/images/offline-base-<hash>.tar (kept, so reruns skip the bootstrap; the .debs
  are cached in .cache/images/debs) and loaded with `docker import` as
  discover/offline-base:<hash>;
- auto (default): public when the registry answers, else offline.

Each image is tagged discover/<name>:latest and labelled with a content hash of its folder, its
build arguments and its base image's id; an image whose hash has not changed is not rebuilt.
A Dockerfile that declares `ARG TORCH_VERSION` / `ARG TRITON_VERSION` / `ARG NUMPY_VERSION` gets
the versions uv.lock pins (the gpu image runs what the project locks). A Dockerfile that copies
`host-ca.pem` gets, in its build context, the certificate bundle the host's pip trusts (PIP_CERT,
else the system bundle): on a network whose HTTPS goes through an inspecting proxy, pip inside the
build needs it.

An image whose folder has a requirements.txt (fully pinned: bio) gets its Python wheels downloaded
by the host's pip, which reaches the package index through the host's proxy and certificates,
into .cache/images/wheels/<name>, and its build context carries them in wheels/: the Dockerfile
installs them without an index, so the build itself needs no network.

Needs a Docker engine (and root plus debootstrap for an offline base; installed with apt-get
when missing and we are root).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

IMAGES_DIR = Path(__file__).resolve().parent
ROOT = IMAGES_DIR.parent
CACHE = ROOT / ".cache" / "images"
REPOSITORY = "discover"
HASH_LABEL = "discover.content-hash"
SUITE = "bookworm"
MIRROR = os.environ.get("DISCOVER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEFAULT_IMAGES = ("python-math", "cpp20", "bio")  # gpu: only when named (several GB from PyPI)
WHEEL_PYTHON = "3.11"  # the Python of both bases: python:3.11-slim and Debian bookworm's python3
# Every manylinux tag up to bookworm's glibc 2.36 (pip does not widen a --platform it is given).
WHEEL_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
OFFLINE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")


def image_tag(name: str) -> str:
    return f"{REPOSITORY}/{name}:latest"


def available_images() -> list[str]:
    return sorted(p.name for p in IMAGES_DIR.iterdir() if (p / "Dockerfile").is_file())


def _log(msg: str) -> None:
    print(f"[images] {msg}", flush=True)


def offline_packages(name: str) -> list[str]:
    path = IMAGES_DIR / name / "offline-packages.txt"
    if not path.is_file():
        raise SystemExit(f"image {name!r} has no offline base (no {path.relative_to(ROOT)}); build it with --base public")
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return sorted({line for line in lines if line})


def _find_image(client, ref: str):
    import docker

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def _ensure_debootstrap() -> str:
    found = shutil.which("debootstrap") or (os.path.exists("/usr/sbin/debootstrap") and "/usr/sbin/debootstrap")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        _log("installing debootstrap with apt-get")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        )
        return shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    raise SystemExit("the offline base needs debootstrap (apt-get install debootstrap) and root")


def offline_base(client, packages: list[str]) -> str:
    """discover/offline-base:<hash> for this package set: bootstrapped, packed and imported once."""
    key = hashlib.sha256("\n".join([SUITE, MIRROR, "minbase", *packages]).encode()).hexdigest()[:12]
    ref = f"{REPOSITORY}/offline-base:{key}"
    if _find_image(client, ref) is not None:
        _log(f"{ref} present ({' '.join(packages)})")
        return ref
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"offline-base-{key}.tar"
    if not tarball.is_file():
        if os.geteuid() != 0:
            raise SystemExit("bootstrapping the offline base needs root (debootstrap); or use --base public")
        debootstrap = _ensure_debootstrap()
        debs = CACHE / "debs"
        debs.mkdir(exist_ok=True)
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _log(f"debootstrap {SUITE} minbase + {' '.join(packages)} from {MIRROR}")
            cmd = [debootstrap, "--variant=minbase", f"--include={','.join(packages)}", f"--cache-dir={debs}", SUITE, str(rootfs), MIRROR]
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if done.returncode != 0:
                sys.stdout.write(done.stdout[-4000:])
                raise SystemExit(f"debootstrap failed (exit {done.returncode})")
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            part = tarball.with_suffix(".tar.part")
            subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(part), "."], check=True)
            part.rename(tarball)
        _log(f"bootstrapped {tarball.relative_to(ROOT)} in {time.monotonic() - start:.0f} s")
    else:
        _log(f"reusing {tarball.relative_to(ROOT)}")
    start = time.monotonic()
    repo, tag = ref.split(":")
    client.api.import_image_from_file(
        str(tarball), repository=repo, tag=tag, changes=[f"ENV {e}" for e in OFFLINE_ENV] + ['CMD ["/bin/sh"]']
    )
    _log(f"imported {ref} in {time.monotonic() - start:.0f} s")
    return ref


def _registry_answers(client, ref: str) -> bool:
    import docker

    if _find_image(client, ref) is not None:
        return True
    try:
        _log(f"pulling {ref}")
        client.images.pull(ref)
        return True
    except docker.errors.APIError as e:
        _log(f"cannot pull {ref} ({str(e).splitlines()[0][:160]}); using the offline base")
        return False


def _default_base(name: str) -> str:
    for line in (IMAGES_DIR / name / "Dockerfile").read_text().splitlines():
        if line.startswith("ARG BASE="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"images/{name}/Dockerfile has no `ARG BASE=` line")


def lock_versions(packages: tuple[str, ...] = ("torch", "triton")) -> dict[str, str]:
    """The versions uv.lock pins for `packages` (name -> version)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    found = {p["name"]: p["version"] for p in lock.get("package", []) if p["name"] in packages}
    missing = sorted(set(packages) - set(found))
    if missing:
        raise SystemExit(f"uv.lock pins no {', '.join(missing)}; run `make lock`")
    return found


def build_args(name: str) -> dict[str, str]:
    """Build arguments besides BASE: the locked torch/triton/numpy versions where the Dockerfile asks."""
    text = (IMAGES_DIR / name / "Dockerfile").read_text()
    args = {}
    for package, versions in (("torch", "TORCH_VERSION"), ("triton", "TRITON_VERSION"), ("numpy", "NUMPY_VERSION")):
        if f"ARG {versions}" in text:
            args[versions] = lock_versions((package,))[package]
    return args


def host_ca_bundle() -> bytes:
    """The certificates the host's pip trusts: PIP_CERT, SSL_CERT_FILE or the system bundle."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_bytes()
    return b""


def build_context(name: str) -> io.BytesIO:
    """The image's folder as a tar build context, plus its wheels in wheels/ when it has a
    requirements.txt, plus host-ca.pem when its Dockerfile copies it."""
    folder = IMAGES_DIR / name
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            tar.add(path, arcname=str(path.relative_to(folder)))
        if (folder / "requirements.txt").is_file():
            for wheel in sorted(download_wheels(name).glob("*.whl")):
                tar.add(wheel, arcname=f"wheels/{wheel.name}")
        if "host-ca.pem" in (folder / "Dockerfile").read_text():
            data = host_ca_bundle()
            info = tarfile.TarInfo("host-ca.pem")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def content_hash(name: str, base_id: str) -> str:
    h = hashlib.sha256(base_id.encode())
    for key, value in sorted(build_args(name).items()):
        h.update(f"{key}={value}\0".encode())
    folder = IMAGES_DIR / name
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _pip() -> list[str]:
    """A pip that can download: the project's tools environment (Makefile), else python3's."""
    tools_pip = ROOT / ".cache" / "tools" / "bin" / "pip"
    if tools_pip.is_file():
        return [str(tools_pip)]
    python = shutil.which("python3") or sys.executable
    return [python, "-m", "pip"]


def download_wheels(name: str) -> Path:
    """The wheels of images/<name>/requirements.txt for the images' Python, in the cache."""
    requirements = IMAGES_DIR / name / "requirements.txt"
    dest = CACHE / "wheels" / name
    dest.mkdir(parents=True, exist_ok=True)
    _log(f"downloading the wheels of {requirements.relative_to(ROOT)} into {dest.relative_to(ROOT)}")
    start = time.monotonic()
    cmd = [
        *_pip(),
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        WHEEL_PYTHON,
        *(arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)),
        "-r",
        str(requirements),
        "-d",
        str(dest),
    ]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-4000:])
        raise SystemExit(f"downloading the wheels of {name} failed (exit {done.returncode}); pip needs the package index")
    _log(f"wheels ready in {time.monotonic() - start:.0f} s ({sum(1 for _ in dest.glob('*.whl'))} files)")
    return dest


def build(client, name: str, base_mode: str, force: bool = False) -> str:
    folder = IMAGES_DIR / name
    if not (folder / "Dockerfile").is_file():
        raise SystemExit(f"unknown image {name!r}; available: {', '.join(available_images())}")
    public = _default_base(name)
    if base_mode == "public" or (base_mode == "auto" and _registry_answers(client, public)):
        base = public
        if _find_image(client, base) is None:
            client.images.pull(base)
    else:
        base = offline_base(client, offline_packages(name))
    base_id = client.images.get(base).id
    digest = content_hash(name, base_id)
    tag = image_tag(name)
    existing = _find_image(client, tag)
    if existing is not None and existing.labels.get(HASH_LABEL) == digest and not force:
        _log(f"{tag} is up to date (base {base}); skipped")
        return tag
    _log(f"building {tag} from {base}")
    start = time.monotonic()
    import docker

    try:
        _, logs = client.images.build(
            fileobj=build_context(name),
            custom_context=True,
            tag=tag,
            buildargs={"BASE": base, **build_args(name)},
            pull=False,
            rm=True,
            forcerm=True,
            labels={HASH_LABEL: digest, "discover.image": name, "discover.base": base},
        )
    except docker.errors.BuildError as e:
        for chunk in e.build_log:
            sys.stdout.write(chunk.get("stream", "") or chunk.get("error", ""))
        raise SystemExit(f"building {tag} failed: {e.msg}") from e
    for chunk in logs:
        line = chunk.get("stream", "").rstrip("\n")
        if line.strip() and not line.startswith((" ---> ", "Removing intermediate")):
            print(("" if line.startswith("Step") else "    ") + line, flush=True)
    _log(f"built {tag} in {time.monotonic() - start:.0f} s")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"images to build (default: {' '.join(DEFAULT_IMAGES)}; also: gpu)")
    parser.add_argument("--base", choices=("auto", "public", "offline"), default=os.environ.get("DISCOVER_IMAGE_BASE", "auto"))
    parser.add_argument("--force", action="store_true", help="rebuild even when the content hash is unchanged")
    parser.add_argument("--if-docker", action="store_true", help="exit 0 with a note when no Docker engine answers")
    args = parser.parse_args(argv)
    try:
        import docker

        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:  # no SDK, no socket, engine down
        if args.if_docker:
            _log(f"no Docker engine answers ({type(e).__name__}); images not built, docker tests will skip")
            return 0
        raise SystemExit(f"no Docker engine answers: {e}") from e
    start = time.monotonic()
    for name in args.names or DEFAULT_IMAGES:
        build(client, name, args.base, force=args.force)
    _log(f"done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
