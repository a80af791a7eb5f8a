"""The ``corral`` command. It talks only to the API (starting an embedded local server on
first use). The parser is the standard library's argparse and each command's module is
imported only when it runs: a person waits for every command's start-up, and click alone
cost a sixth of it. Commands that change jobs are in ``jobs``, those that read in ``views``,
tokens, login and the audit trail in ``access``;
``corral sim`` (the simulator, no server) keeps its own click command in ``sim``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from corral import __version__

class _FORMATTER(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter with the terminal's width found without shutil, whose import
    brings three compressors (argparse builds a formatter for every argument it adds)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None):
        if width is None:
            from corral.cli.render import terminal_columns

            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _command(sub, name: str, run: str, summary: str, description: str | None = None, **extra) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=summary, description=description or summary, formatter_class=_FORMATTER,
                            **extra)
    parser.set_defaults(run=run)
    return parser


class _Skipped:
    """Stands in for the parser of a command this run does not invoke, taking every call and
    doing nothing: argparse translates each help string through gettext as it is added, and
    building all thirty commands cost more than the rest of a read command's start-up."""

    def __getattr__(self, name: str):
        return self._ignore

    def _ignore(self, *args, **kwargs) -> "_Skipped":
        return self


_SKIPPED = _Skipped()


def _whole(low: int, high: int):
    """An argparse type: a whole number in low..high written in ASCII digits (``int`` alone
    takes any script's digits, so ``--num-nodes ٣`` was 3)."""
    def parse(text: str) -> int:
        digits = text.strip().removeprefix("-").removeprefix("+")
        if not (digits.isascii() and digits.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value
    return parse


def _nonnegative(limit: int):
    return _whole(0, limit)


def build(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (``only``) one whose other commands are left out; its
    ``commands`` lists every command's name either way."""
    parser = argparse.ArgumentParser(prog="corral", formatter_class=_FORMATTER,
                                     description="corral: gang-scheduled AI job groups on this machine and beyond.")
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = []

    def command(name: str, *args, **kwargs):
        parser.commands.append(name)
        if only is not None and name != only:
            return _SKIPPED
        return _command(sub, name, *args, **kwargs)


    c = command("launch", "jobs:launch", "Submit a task or job-group YAML and stream its logs until it ends.",
                 "Submit FILE (a task or job-group YAML, or a Slurm batch script: a #! line and #SBATCH "
                 "directives) and stream its logs until it ends; exit 0 only if it SUCCEEDED. While it waits, say why and when it is expected to start. Ctrl-C detaches.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("-d", "--detach", action="store_true", help="print the job id and return at once")
    c.add_argument("--name", help="override the job name")
    c.add_argument("--env", action="append", default=[], metavar="K[=V]",
                   help="add or override an environment variable of every task (repeatable); without =V, "
                        "its value in this shell")
    c.add_argument("--secret", action="append", default=[], metavar="K[=V]",
                   help="a secret of every task: set like --env, kept with the job's secrets (repeatable); without =V, "
                        "its value in this shell")
    c.add_argument("--export", metavar="ALL|NONE|VARS",
                   help="which of your environment variables the replicas start with, as sbatch --export: ALL "
                        "(default unless config.yaml says otherwise), NONE, or VAR1,VAR2,NAME=value")
    c.add_argument("--workdir", "-D", "--chdir", dest="workdir", metavar="DIR",
                   help="run every task in DIR (relative: to this directory); default: each task's workdir "
                        "resolved against this directory, else this directory")
    c.add_argument("--num-nodes", dest="num_nodes", type=_whole(1, 100_000), metavar="N",
                   help="override a single-task file's num_nodes (as sky launch --num-nodes)")
    c.add_argument("--gpus", metavar="TYPE:N", help="override its resources.accelerators, e.g. H100:8 (sky launch --gpus)")
    c.add_argument("--cpus", metavar="N[+]", help="override its resources.cpus (sky launch --cpus)")
    c.add_argument("--memory", metavar="GB[+]", help="override its resources.memory (sky launch --memory)")
    c.add_argument("--image-id", dest="image_id", metavar="docker:IMAGE",
                   help="override its resources.image_id (sky launch --image-id)")
    c.add_argument("-p", "--partition", help="partition to run in (default: the site's first)")
    c.add_argument("--slurm", action="store_true",
                   help="run the job as one Slurm job: in the site's first partition with infra: slurm")
    c.add_argument("-A", "--account", help="account to charge (default: the first that lists you, else your user name)")
    c.add_argument("-q", "--qos", help="quality of service")
    c.add_argument("-t", "--time-limit", dest="time_limit",
                   help="time limit of the whole job: minutes (as sbatch -t), 2h, 1d12h, H:MM:SS or D-HH:MM:SS")
    c.add_argument("--nice", type=_whole(-10000, 10000), help="lower the job's priority by this much")
    c.add_argument("--dependency", help="e.g. afterok:12:13,afterany:14 or singleton")
    c.add_argument("--kill-on-invalid-dep", action="store_true",
                   help="cancel the job if its dependency can never be satisfied")
    c.add_argument("-H", "--hold", action="store_true", help="submit held: it waits until `corral release`")
    c.add_argument("-a", "--array", help="submit a job array: indices like 0-15, 1,3,5-9:2; %%N runs at most N at once")

    command("sbatch", "", "Submit a Slurm batch script with sbatch's options (corral sbatch --help).",
             add_help=False)

    c = command("queue", "views:queue", "List jobs: every running one and the first 100 pending (--all: every one).",
                 "List jobs, like squeue: every running job and the first 100 pending ones (oldest first), with a "
                 "line on stderr saying how many more wait. --all lists every live job and the newest 1000 ended "
                 "ones; --json prints every live job (with --all, the ended ones too).")
    c.add_argument("-a", "--all", action="store_true",
                   help="every live job, and the newest 1000 ended ones (corral acct for more)")
    c.add_argument("-u", "--user", help="only this user's jobs")
    c.add_argument("--priority", action="store_true",
                   help="pending jobs in scheduling order with their priority factors (like sprio)")
    c.add_argument("--start", action="store_true",
                   help="pending jobs with their expected start from the scheduler's reservations (like squeue --start)")
    c.add_argument("--json", action="store_true")

    c = command("acct", "views:acct", "Accounting, like sacct.",
                 "Accounting, like sacct: every job alive in a time window with submit, start and end times, "
                 "elapsed time, exit code, state and GPU-hours (GPUs x elapsed).")
    c.add_argument("-u", "--user", help="only this user's jobs")
    c.add_argument("-A", "--account", help="only jobs charged to this account")
    c.add_argument("-p", "--partition", help="only jobs in this partition")
    c.add_argument("-s", "--state", action="append", default=[], metavar="STATE",
                   help="only jobs in these states: repeatable or comma-separated, Slurm's short forms too (PD,R,CD,F,CA,TO)")
    c.add_argument("-S", "--starttime", default="", help="jobs alive at or after this time (default: today 00:00)")
    c.add_argument("-E", "--endtime", default="now", help="jobs submitted by this time (default: now)")
    c.add_argument("--format", choices=["table", "csv", "json"], default="table")
    c.add_argument("--json", action="store_true", help="same as --format json")

    c = command("status", "views:status", "Show one job, its tasks and every replica.")
    c.add_argument("job", metavar="JOB")
    c.add_argument("--json", action="store_true")

    c = command("events", "views:events", "Tell a job's story: every state transition with its time and cause.")
    c.add_argument("job", metavar="JOB")
    c.add_argument("--json", action="store_true")

    c = command("logs", "jobs:logs",
                 "Print the logs of a job (every replica, prefixed) or of one REPLICA (e.g. trainer-0).")
    c.add_argument("job", metavar="JOB")
    c.add_argument("replica", metavar="REPLICA", nargs="?")
    c.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")
    c.add_argument("-n", "--tail", type=_nonnegative(10_000_000), metavar="N",
                   help="only the last N lines of each replica")

    c = command("exec", "shell:exec_", "Run a command in a running replica's world (as kubectl exec does).",
                 "Run COMMAND in a running replica of JOB (rank 0 of its first task, or REPLICA, e.g. trainer-1, "
                 "given before --): in its namespaces or container, working directory and environment, as its "
                 "Unix account. Exits with COMMAND's exit code; stdout and stderr stay apart; piped stdin is "
                 "passed on. Allowed to the job's owner and operators, and recorded in the audit trail.",
                 usage="corral exec [-t] [-i] JOB [REPLICA --] COMMAND [ARG ...]")
    c.add_argument("-t", "--tty", action="store_true", help="give COMMAND a terminal (this one in raw mode)")
    c.add_argument("-i", "--stdin", action="store_true", help="pass this terminal's input on (piped input always is)")
    c.add_argument("job", metavar="JOB")
    c.add_argument("rest", nargs=argparse.REMAINDER, metavar="[REPLICA --] COMMAND")

    c = command("shell", "shell:shell", "Open an interactive shell in a running replica (srun --pty, kubectl exec -it).",
                 "Open an interactive shell (bash, else sh) in a running replica of JOB (rank 0 of its first task, "
                 "or REPLICA, e.g. rollout-2): its namespaces or container, working directory, environment and "
                 "Unix account, with a real terminal (resize, Ctrl-C, job control). Exits with the shell's exit "
                 "code. Allowed to the job's owner and operators, and recorded in the audit trail.")
    c.add_argument("job", metavar="JOB")
    c.add_argument("replica", metavar="REPLICA", nargs="?")

    c = command("cancel", "jobs:cancel", "Cancel jobs: their stop signal, then SIGKILL after the grace period.",
                 "Cancel jobs: every replica gets its stop signal, then SIGKILL after its grace period. With "
                 "filters (like scancel), every active job that matches them all (and is among JOBs, if given).")
    c.add_argument("jobs", metavar="JOB", nargs="*")
    c.add_argument("-u", "--user", help="only jobs of this user (filters default to your own jobs, like scancel)")
    c.add_argument("-t", "--state", action="append", default=[], metavar="STATE",
                   help="only jobs in these states: PENDING, STARTING, RUNNING (or PD, R; repeatable or comma-separated)")
    c.add_argument("-n", "--name", help="only jobs of this name")
    c.add_argument("-p", "--partition", help="only jobs in this partition")
    c.add_argument("--force", action="store_true",
                   help="SIGKILL every replica now, without its grace period (also one already in it), "
                        "as scancel -s KILL or kubectl delete --force")

    for name, summary in (("hold", "Keep pending jobs from starting until `corral release` (reason JobHeldUser; "
                                   "JobHeldAdmin when an operator holds another user's job)."),
                          ("release", "Let held jobs be scheduled again."),
                          ("requeue", "Stop running jobs (stop signal, grace period) and queue them again: same id, "
                                      "names and checkpoint directory; CORRAL_RESTART_COUNT goes up.")):
        c = command(name, "jobs:each", summary)
        c.add_argument("jobs", metavar="JOB", nargs="+")
        c.set_defaults(action=name, hold=False)
        if name == "requeue":
            c.add_argument("-H", "--hold", action="store_true",
                           help="hold it once it is pending again (scontrol requeuehold)")

    c = command("update", "jobs:update", "Change pending jobs' priority or nice, like scontrol update.",
                 "Change pending jobs' fixed priority (operators; 'formula' goes back to the computed one) or "
                 "nice (its owner may raise it, lowering the job; a negative nice is for operators).")
    c.add_argument("jobs", metavar="JOB", nargs="+")
    c.add_argument("--priority", help="a fixed priority, or 'formula'")
    c.add_argument("--nice", type=_whole(-10000, 10000), help="lower the job's priority by this much (-10000..10000)")

    c = command("scale", "jobs:scale", "Set how many replicas TASK of JOB runs (within its num_nodes: {min, max}), "
                "or its bounds with --min/--max; a count alone on an autoscaled task pins min = max = count.")
    c.add_argument("job", metavar="JOB")
    c.add_argument("task", metavar="TASK")
    c.add_argument("replicas", metavar="REPLICAS", type=_nonnegative(4096), nargs="?")
    c.add_argument("--min", dest="min_nodes", type=_nonnegative(4096), help="its fewest replicas from now on")
    c.add_argument("--max", dest="max_nodes", type=_nonnegative(4096), help="its most replicas from now on")

    c = command("nodes", "views:nodes", "List the node pool and what is free on each node.")
    c.add_argument("--json", action="store_true")

    c = command("share", "views:share", "Fair share of every account and user (like sshare).")
    c.add_argument("--json", action="store_true")

    c = command("dashboard", "dashboard:dashboard", "Print the web dashboard's address, signed in (with --open, open it).",
                 "Print the address of the web dashboard of the server this command talks to (CORRAL_SERVER, "
                 "else the last `corral login`, else this CORRAL_HOME's, started if need be), with this "
                 "command's token in its fragment (ADDRESS#token=TOKEN): the page signs in with it and drops it "
                 "from the address bar. The address is a credential: do not share it.")
    c.add_argument("--open", action="store_true", help=(
        "also open it in a web browser, through a private local file (CORRAL_HOME/dashboard.html) that redirects "
        "to it, so the token is not on the browser's command line"))

    command("sim", "", "Replay a job trace through the scheduler (corral sim --help).", add_help=False)

    token = command("token", "", "Create, list and revoke API tokens (admins).")
    actions = token.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = _command(actions, "create", "access:token_create", "Make a token for USER and print it (shown this once).")
    c.add_argument("user", metavar="USER")
    c.add_argument("--role", choices=["admin", "operator", "user", "viewer"],
                   help="what it may do (default: config.yaml's: operators are operators, others users)")
    c.add_argument("--expires", metavar="DURATION", help="lifetime: 30d, 12h, 1d12h or seconds (default: until revoked)")
    c.add_argument("--note", help="what the token is for (shown by token list)")
    c.add_argument("--json", action="store_true")
    c = _command(actions, "list", "access:token_list", "List tokens: id, user, role, created, expires, last used.")
    c.add_argument("--revoked", action="store_true", help="include revoked tokens")
    c.add_argument("--json", action="store_true")
    c = _command(actions, "revoke", "access:token_revoke", "Revoke tokens by id: refused from their next request.")
    c.add_argument("ids", metavar="ID", nargs="+", type=_nonnegative(2**62))

    c = command("login", "access:login", "Check a token against SERVER and save both for later commands.",
                 "Check TOKEN against SERVER (https://host:port) and save both (0600, under $XDG_CONFIG_HOME/corral) "
                 "so later commands and corral.Client() use them. Without --token, it is read from the terminal "
                 "(or one line of stdin).")
    c.add_argument("server", metavar="SERVER")
    c.add_argument("--token", help="the token (prefer the prompt: a command line is visible to other users)")
    c.add_argument("--ca-bundle", metavar="FILE", help="CA certificates to verify the server's TLS certificate")
    c = command("logout", "access:logout", "Forget the saved token of SERVER (default: the current one).")
    c.add_argument("server", metavar="SERVER", nargs="?")
    c = command("whoami", "access:whoami", "Say which user and role this client acts as, and where.")
    c.add_argument("--json", action="store_true")
    c = command("audit", "access:audit", "Who did what, when and from where (admins).")
    c.add_argument("-S", "--since", help="entries at or after this ISO 8601 time")
    c.add_argument("-u", "--user", help="only this user's actions")
    c.add_argument("-a", "--action", help="only this action: submit, cancel, hold, release, requeue, scale, priority, "
                                          "token_create, token_revoke")
    c.add_argument("-n", "--limit", type=_nonnegative(10000), default=1000, help="the newest N entries (default 1000)")
    c.add_argument("--json", action="store_true")

    server = command("server", "", "Manage the embedded local server.")
    actions = server.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = _command(actions, "start", "server:cli_start", "Start the local server in the background (idempotent).",
                 "Start the local server in the background (idempotent). It listens on loopback unless --host "
                 "says otherwise; wherever it listens, every request needs a token (this machine's owner's "
                 "commands use the local one in CORRAL_HOME).")
    c.add_argument("--host", help="address to listen on, e.g. 0.0.0.0 (default 127.0.0.1)")
    c.add_argument("--port", type=_nonnegative(65535), help="port (default: a free one)")
    c.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate (chain)")
    c.add_argument("--tls-key", metavar="FILE", help="and this PEM private key")
    _command(actions, "stop", "server:cli_stop",
             "Stop the local server; running replicas keep running and are adopted at the next start.")
    c = _command(actions, "status", "server:cli_status", "Say whether the local server runs, where, and on which database.")
    c.add_argument("--json", action="store_true")
    return parser


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail a second time
    into a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:  # its own (click) command, with the scheduler and simulator behind it
        from corral.cli.sim import sim

        sim.main(args=argv[1:], prog_name="corral sim")
        return
    if argv[:1] == ["sbatch"]:  # sbatch's own option syntax, read by corral.spec.sbatch
        from corral.cli.batch import sbatch_main

        sbatch_main(argv[1:])
        return
    named = next((a for a in argv if not a.startswith("-")), None)
    parser = build(only=named)
    if named not in parser.commands:  # --help, --version or a typo: argparse lists every command
        parser = build()
    args = parser.parse_args(argv)
    module, function = args.run.split(":")
    from corral.cli.render import Usage, fail
    from corral.client import CorralError

    try:
        getattr(importlib.import_module(f"corral.cli.{module}"), function)(args)
    except BrokenPipeError:  # `corral acct --format csv | head -3`: the reader is gone, as for any filter
        _quiet_stdout()
        sys.exit(141)
    except Usage as exc:
        print(f"corral {args.command}: error: {exc.option}: {exc.message}", file=sys.stderr)
        sys.exit(2)
    except CorralError as exc:  # whatever a command did not catch itself (no server, a bad config.yaml …)
        fail(exc)
    except (KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        # an answer of a shape no corral server gives (another program on the port, another
        # version): one line, never a traceback, unless asked for (CORRAL_DEBUG=1)
        if os.environ.get("CORRAL_DEBUG"):
            raise
        print(f"corral {args.command}: error: the server's answer is not what this corral expects "
              f"({type(exc).__name__}: {str(exc)[:200]}); is CORRAL_SERVER a corral server of this version? "
              "(CORRAL_DEBUG=1 shows where)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
