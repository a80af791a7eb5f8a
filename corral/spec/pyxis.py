"""Pyxis's container options (Slurm's container plugin, on enroot) as corral reads them: on
``srun`` lines of a batch script, and as ``#SBATCH`` directives that put the batch script
itself in a container.

What users write is Pyxis's: ``--container-image=[USER@][REGISTRY#]IMAGE[:TAG]``,
``--container-mounts=SRC:DST[:FLAGS],…``, ``--container-workdir``, ``--container-name``,
``--container-env``, ``--[no-]container-mount-home``, ``--[no-]container-remap-root``,
``--container-writable``/``--container-readonly``, ``--[no-]container-entrypoint``. This
module turns them into a ``StepContainer`` (pure data, JSON-storable) that the node runs on
its own engine (``corral.node.stepcontainer``), or leaves them to Slurm's own ``srun`` where
the site has Pyxis (``pass_through``).

Image references follow enroot (``docker://`` URIs, ``src/docker.sh``): the registry comes
before a ``#``, Docker Hub (``registry-1.docker.io``) is the default and a one-part name there
is under ``library/``, the tag defaults to ``latest``. A first path component that is a host
name (a dot, a port or ``localhost``: ``nvcr.io/nvidia/pytorch``) is taken as the registry,
as enroot does when its credentials file names that host; Docker Hub has no namespace that
looks like one, so nothing else could be meant. A squashfs file (``/path/x.sqsh``) is enroot's
own image format: Podman cannot run it, so it is refused with a sentence naming the option."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from corral.spec.batchshell import shell_words
from corral.spec.imageref import image_of

# long name -> takes a value (the srun/sbatch spelling without "--")
OPTIONS: dict[str, bool] = {
    "container-image": True, "container-mounts": True, "container-workdir": True, "container-name": True,
    "container-env": True, "container-save": True,
    "container-mount-home": False, "no-container-mount-home": False,
    "container-remap-root": False, "no-container-remap-root": False,
    "container-writable": False, "container-readonly": False,
    "container-entrypoint": False, "no-container-entrypoint": False, "container-entrypoint-log": False,
}
HUB = "docker.io"
# what podman's -v takes of enroot's mount flags (Pyxis joins them with "+")
_MOUNT_FLAGS = {"ro", "rw", "private", "rprivate", "slave", "rslave", "shared", "rshared", "bind", "rbind"}
_ENROOT = re.compile(r"(?:(?P<user>[A-Za-z0-9_.!~*'()%;:&=+$,-]+)@)?(?:(?P<registry>[^#]+)#)?"
                     r"(?P<image>[a-z0-9/._-]+)(?::(?P<tag>[A-Za-z0-9._:-]+))?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:[0-9]+")
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Mount:
    source: str  # a path on the node ("tmpfs" for a tmpfs)
    target: str
    flags: tuple[str, ...] = ()

    @property
    def readonly(self) -> bool:
        return "ro" in self.flags


@dataclass(frozen=True)
class StepContainer:
    """A step's (or a batch script's) container, as Pyxis's options asked for it."""

    image: str | None = None  # a registry reference (``registry_reference``); None: only a name reused
    user: str | None = None  # enroot's USER@: whose registry login pulls the image
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None
    name: str | None = None
    name_flag: str = ""  # --container-name=NAME:FLAG: auto (""), create, exec or no_exec
    env: tuple[str, ...] = ()  # variables the host's value wins for (--container-env)
    mount_home: bool = False
    remap_root: bool = False
    writable: bool = True
    entrypoint: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StepContainer:
        data = json.loads(text)
        data["mounts"] = tuple(Mount(m["source"], m["target"], tuple(m["flags"])) for m in data.get("mounts", ()))
        data["env"] = tuple(data.get("env", ()))
        return cls(**data)


class PyxisError(ValueError):
    """A container option corral cannot honour: ``option`` names it (``--container-image``)."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


def registry_reference(text: str) -> tuple[str, str | None]:
    """(registry reference, enroot USER or None) of ``--container-image``'s value; PyxisError
    naming the option when it is a squashfs file or not an enroot image."""
    value = text.strip()
    if value.startswith("docker://"):
        value = value[len("docker://"):]
    if not value:
        raise PyxisError("--container-image", "names no image (write [USER@][REGISTRY#]IMAGE[:TAG])")
    if value.startswith(("/", "./", "../")) or value.endswith((".sqsh", ".squashfs")):
        raise PyxisError("--container-image", f"{text} is a squashfs image file, enroot's own format, which the "
                         "node's container engine (Podman) cannot run; import it into a registry and name it "
                         "[REGISTRY#]IMAGE[:TAG], or run on a Slurm site with Pyxis")
    if value.startswith(("dockerd://", "podman://")):
        raise PyxisError("--container-image", f"{text}: images of a local Docker daemon are not what corral's "
                         "nodes share; name a registry image [REGISTRY#]IMAGE[:TAG]")
    first, slash, rest = value.partition("/")
    if "#" not in value and slash and _HOST_PORT.fullmatch(first.rpartition("@")[2]):
        value = f"{first}#{rest}"  # host:5000/x: a registry with its port, as Docker writes it
    match = _ENROOT.fullmatch(value)
    if match is None:
        raise PyxisError("--container-image", f"{text!r} is not an enroot image like nvcr.io#nvidia/pytorch:24.05-py3 "
                         "or ubuntu:22.04 ([USER@][REGISTRY#]IMAGE[:TAG], image names lowercase)")
    user, registry, image, tag = match.group("user", "registry", "image", "tag")
    if registry is None and "/" in image and _is_host(image.split("/", 1)[0]):
        registry, image = image.split("/", 1)
    registry = HUB if registry in (None, "registry-1.docker.io", "index.docker.io") else registry
    if registry == HUB and "/" not in image:
        image = f"library/{image}"
    reference = f"{registry}/{image}" + (f":{tag}" if tag else "")
    try:
        image_of("docker:" + reference)
    except ValueError:
        raise PyxisError("--container-image", f"{text!r} names no registry image corral can pull "
                         f"({reference} is not a valid reference)") from None
    return reference, user


def _is_host(part: str) -> bool:
    return "." in part or ":" in part or part == "localhost"


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """``SRC[:DST[:FLAGS]]`` entries, comma separated, flags joined by ``+`` (Pyxis's form)."""
    out = []
    for entry in text.split(","):
        if not entry:
            raise PyxisError("--container-mounts", f"{text!r} has an empty entry")
        parts = entry.split(":")
        if len(parts) > 3 or not parts[0] or (len(parts) > 1 and not parts[1]):
            raise PyxisError("--container-mounts", f"{entry!r} is not SRC:DST[:FLAGS]")
        source, target = parts[0], parts[1] if len(parts) > 1 else parts[0]
        flags = tuple(f for f in (parts[2].split("+") if len(parts) > 2 else []) if f)
        if source == "umount":
            raise PyxisError("--container-mounts", f"{entry!r}: unmounting a path of the image is enroot's own; "
                             "corral's containers mount nothing of the node but what is asked")
        if source != "tmpfs" and not source.startswith(("/", ".")):
            raise PyxisError("--container-mounts", f"{entry!r}: a mount source is a path (absolute or ./relative) "
                             "or tmpfs")
        if not target.startswith(("/", ".")):
            raise PyxisError("--container-mounts", f"{entry!r}: a mount target is a path")
        unknown = [f for f in flags if f not in _MOUNT_FLAGS]
        if unknown:
            raise PyxisError("--container-mounts", f"{entry!r}: mount flag {unknown[0]!r} is not one corral passes "
                             f"to the engine ({', '.join(sorted(_MOUNT_FLAGS))})")
        if "ro" in flags and "rw" in flags:
            raise PyxisError("--container-mounts", f"{entry!r}: ro and rw together")
        out.append(Mount(source, target, flags))
    return tuple(out)


def split(argv: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    """Pyxis's options taken out of srun's arguments, up to the command: (given, the rest).
    The rest keeps srun's own options and the command, in order."""
    given: dict[str, str | bool] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-"):
            return given, rest + argv[i:]
        name, sep, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
        if name in OPTIONS:
            if OPTIONS[name]:
                if not sep:
                    if i + 1 >= len(argv):
                        raise PyxisError(f"--{name}", "needs a value")
                    i += 1
                    value = argv[i]
                given[name] = value
            elif sep:
                raise PyxisError(f"--{name}", "takes no value")
            else:
                given[name] = True
        else:
            rest.append(word)
            if not sep and _srun_takes_value(word) and i + 1 < len(argv):
                i += 1
                rest.append(argv[i])
        i += 1
    return given, rest


def _srun_takes_value(word: str) -> bool:
    """Whether srun's own option ``word`` (given without ``=``) takes the next word."""
    from corral.node.srun import _FLAGS, _OPTIONAL, _OPTIONS, _SHORT

    if word.startswith("--"):
        name = word[2:]
        return name in _OPTIONS and name not in _FLAGS and name not in _OPTIONAL
    name = _SHORT.get(word[1:2], "")
    return bool(name) and len(word) == 2 and name not in _FLAGS and name not in _OPTIONAL


def container_of(given: dict[str, str | bool], base: StepContainer | None = None) -> StepContainer | None:
    """The container Pyxis's options ask for (None: none), over ``base`` (the batch script's,
    whose options a step inherits, as Pyxis's sbatch support hands them on); PyxisError
    naming the option."""
    if not given:
        return base
    for a, b in (("container-mount-home", "no-container-mount-home"), ("container-remap-root", "no-container-remap-root"),
                 ("container-writable", "container-readonly"), ("container-entrypoint", "no-container-entrypoint")):
        if a in given and b in given:
            raise PyxisError(f"--{b}", f"both --{a} and --{b} were given")
    if "container-save" in given:
        raise PyxisError("--container-save", "saves the container as a squashfs file, enroot's own format, which "
                         "the node's engine (Podman) cannot make; use --container-name to keep a container's state "
                         "within the job")
    image, user = (None, None)
    if "container-image" in given:
        image, user = registry_reference(str(given["container-image"]))
    elif base is not None:
        image, user = base.image, base.user
    name, flags = given.get("container-name"), ""
    if name is not None:
        name = str(name).split(":", 1)[0]
        flags = str(given["container-name"]).partition(":")[2]
        if flags not in ("", "auto", "create", "exec", "no_exec"):
            raise PyxisError("--container-name", f"flag {flags!r} is not auto, create, exec or no_exec")
        if not _NAME.fullmatch(name):
            raise PyxisError("--container-name", f"{name!r} is not a container name (letters, digits, _ . -)")
    if image is None and name is None:
        raise PyxisError(f"--{next(iter(given))}", "needs --container-image (the image of the container it is for)")
    env = tuple(base.env) if base is not None else ()
    if "container-env" in given:
        env = tuple(v for v in str(given["container-env"]).split(","))
        bad = [v for v in env if not _VAR.fullmatch(v)]
        if bad:
            raise PyxisError("--container-env", f"{bad[0]!r} is not a variable name")
    workdir = given.get("container-workdir", base.workdir if base else None)
    if workdir is not None and not str(workdir).startswith("/"):
        raise PyxisError("--container-workdir", f"{workdir!r} is not an absolute path inside the container")

    def flag(on: str, off: str, default: bool) -> bool:
        return True if on in given else False if off in given else default

    return StepContainer(
        image=image, user=user,
        mounts=(base.mounts if base and "container-mounts" not in given else ())
        + (parse_mounts(str(given["container-mounts"])) if "container-mounts" in given else ()),
        workdir=workdir, name=name, name_flag=flags if name is not None else "", env=env,
        mount_home=flag("container-mount-home", "no-container-mount-home", base.mount_home if base else False),
        remap_root=flag("container-remap-root", "no-container-remap-root", base.remap_root if base else False),
        writable=flag("container-writable", "container-readonly", base.writable if base else True),
        entrypoint=flag("container-entrypoint", "no-container-entrypoint", base.entrypoint if base else False))


def pass_through(help_text: str) -> bool:
    """Whether a site's ``srun --help`` lists Pyxis's options: then its own srun takes them."""
    return "--container-image" in help_text


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """The script's lines with backslash continuations joined, each with its first line's number."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def script_steps(text: str) -> list[tuple[int, dict[str, str | bool] | PyxisError]]:
    """Each ``srun`` command line of a script that gives Pyxis options: its line and the
    options (or what is wrong with them), read at submit so a mistake is a sentence then.
    Lines a shell builds at run time are checked when they run (``corral.node.srun``)."""
    found: list[tuple[int, dict[str, str | bool] | PyxisError]] = []
    for number, line in _logical_lines(text):
        if "srun" not in line or "--container-" not in line or line.lstrip().startswith("#"):
            continue
        for command in re.split(r"&&|\|\||[;&|]", line):
            try:
                words = shell_words(command)
            except ValueError:
                continue
            while words and words[0] in ("exec", "time", "nohup", "command", "then", "do", "else", "{", "("):
                words = words[1:]
            if not words or words[0].rsplit("/", 1)[-1] != "srun":
                continue
            try:
                given, _ = split(words[1:])
                if any("$" in str(v) or "`" in str(v) for v in given.values()):
                    continue  # a value the shell makes at run time (--container-name=$NAME): checked then
                if given:
                    container_of(given)
                    found.append((number, given))
            except PyxisError as exc:
                found.append((number, exc))
    return found
