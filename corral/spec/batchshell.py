"""The bash around a Slurm batch script on corral: the ``run`` of its tasks.

The script's text travels inside the job (a here-document written next to the job's runtime
files at launch), so a requeued job runs the script it was submitted with. Before running
it, the shell applies what the launch environment (``corral.runtime.batchenv``) asks for;
then it runs the script in a session of its own and relays the signals the replica gets, the
way Slurm routes them (``RELAY``)."""

from __future__ import annotations

import secrets
import shlex

# A replica holding one of the job's other nodes: it waits until the script ends (then it is
# stopped like any auxiliary task) and exits 0 on the stop signal. Where the executor runs
# step agents (``corral.node.stepagent``) it is its node's agent: the script's steps run there.
HOLD = ('if [ -n "${CORRAL_STEP_AGENTS:-}" ] && [ -x "${CORRAL_STEP_AGENT:-}" ] '
        '&& "$CORRAL_STEP_AGENT" --runnable 2>/dev/null; then exec "$CORRAL_STEP_AGENT"; fi; '
        "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done")


def runner(text: str, args: tuple[str, ...]) -> str:
    """Bash that writes the script next to the job's runtime files and runs it, after setting
    up what the launch environment (``corral.runtime.batchenv``) asks for: ``srun``/``scontrol``
    on PATH off Slurm, ``--output``/``--error`` files (copied to the job's log too, through tee
    processes that ignore the job's signals), and a signal meant only for the steps
    (``--signal`` without ``B:``) ignored by the batch shell; then relays signals (``RELAY``)."""
    marker = f"CORRAL_SBATCH_{secrets.token_hex(8)}"
    while marker in text:
        marker = f"CORRAL_SBATCH_{secrets.token_hex(8)}"
    body = text if text.endswith("\n") else text + "\n"
    quoted = " ".join(shlex.quote(a) for a in args)
    return (f"__script=\"$(dirname \"${{CORRAL_HOSTS_FILE:-${{TMPDIR:-/tmp}}/x}}\")/sbatch.$CORRAL_LAUNCH_KEY\"\n"
            f"cat > \"$__script\" <<'{marker}'\n{body}{marker}\n"
            f"chmod 700 \"$__script\"\n{PRELUDE}setsid \"${{__env[@]}}\" $__box \"$__script\" {quoted} &\n__pid=$!\n{RELAY}")


PRELUDE = """\
if [ -n "${CORRAL_SLURM_SHIMS:-}" ]; then PATH="$CORRAL_SLURM_SHIMS:$PATH"; export PATH; fi
trap '' TERM INT HUP QUIT USR1 USR2
__tees=()
__file() {  # as Slurm: a file whose directory does not exist fails the job, nothing is created for it
  if [ ! -d "$(dirname "$2")" ]; then
    echo "corral: the job failed: its $1 file $2 cannot be created: directory $(dirname "$2") does not exist; Slurm fails such a job too: create the directory, then submit again" >&2
    exit 1
  fi
  if ! { : >> "$2"; } 2>/dev/null; then
    echo "corral: the job failed: its $1 file $2 cannot be written" >&2
    exit 1
  fi
}
[ -z "${CORRAL_SBATCH_OUTPUT:-}" ] || __file --output "$CORRAL_SBATCH_OUTPUT"
[ -z "${CORRAL_SBATCH_ERROR:-}" ] || __file --error "$CORRAL_SBATCH_ERROR"
if [ -n "${CORRAL_SBATCH_OUTPUT:-}" ]; then
  if [ -z "${CORRAL_SBATCH_ERROR:-}" ] || [ "$CORRAL_SBATCH_ERROR" = "$CORRAL_SBATCH_OUTPUT" ]; then
    exec > >(exec tee "$CORRAL_SBATCH_OUTPUT") 2>&1
  else
    exec > >(exec tee "$CORRAL_SBATCH_OUTPUT")
  fi
  __tees+=($!)
fi
if [ -n "${CORRAL_SBATCH_ERROR:-}" ] && [ "${CORRAL_SBATCH_ERROR}" != "${CORRAL_SBATCH_OUTPUT:-}" ]; then
  exec 2> >(exec tee "$CORRAL_SBATCH_ERROR" >&2)
  __tees+=($!)
fi
trap - TERM INT HUP QUIT USR1 USR2
if [ -n "${CORRAL_SBATCH_STEP_SIGNAL:-}" ]; then trap '' "${CORRAL_SBATCH_STEP_SIGNAL#SIG}"; fi
# #SBATCH --container-image: the script runs in that container (``corral.node.stepcontainer``)
__box=; [ -z "${CORRAL_SBATCH_CONTAINER:-}" ] || __box="$CORRAL_SBATCH_BOX"
__env=()
if [ -n "${CORRAL_SBATCH_EXPORT_NONE:-}" ]; then
  __env=(env -i)
  for __name in $(compgen -e) $CORRAL_SBATCH_KEEP; do
    case "$__name" in
      SLURM_*|SLURMD_*|CORRAL_*|CUDA_VISIBLE_DEVICES|PATH|HOME|USER|LOGNAME|SHELL|TMPDIR|LANG|TERM|PYTHONPATH) ;;
      *) case " $CORRAL_SBATCH_KEEP " in *" $__name "*) ;; *) continue ;; esac ;;
    esac
    __env+=("$__name=${!__name}")
  done
fi
"""

# The script runs in a session of its own and this shell relays what the replica is sent
# (then gives the tee processes of the output files up to 2 s to write the last lines):
# a stop to the script's whole process group (its steps and children), the --signal=B:…
# warning to the script alone, a --signal warning without B: to the group (where only the
# steps, started by srun, listen for it).
RELAY = """\
for __sig in TERM INT HUP QUIT USR1 USR2; do trap "kill -s $__sig -- -$__pid 2>/dev/null" "$__sig"; done
if [ -n "${CORRAL_SBATCH_BATCH_SIGNAL:-}" ]; then
  trap "kill -s ${CORRAL_SBATCH_BATCH_SIGNAL#SIG} $__pid 2>/dev/null" "${CORRAL_SBATCH_BATCH_SIGNAL#SIG}"
fi
while :; do wait "$__pid"; __rc=$?; kill -0 "$__pid" 2>/dev/null || break; done
wait "$__pid" 2>/dev/null; __last=$?; [ "$__last" -ne 127 ] && __rc=$__last
# the output files get the script's last lines before the attempt ends (and its tree with it)
exec >&- 2>&-
for __i in $(seq 40); do
  __alive=""
  for __tee in "${__tees[@]}"; do kill -0 "$__tee" 2>/dev/null && __alive=1; done
  [ -z "$__alive" ] && break
  sleep 0.05
done
exit "$__rc"
"""


def shell_words(text: str) -> list[str]:
    """The words of one command line as bash splits them: a ``#`` starts a comment only at a
    word's start (``nvcr.io#nvidia/pytorch``, enroot's image form, is one word, which
    ``shlex``'s comment rule would cut); ValueError on an unclosed quote."""
    quote = ""
    cut = len(text)
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"':
                continue
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()) and not (i > 0 and text[i - 1] == "\\"):
            cut = i
            break
    return shlex.split(text[:cut])
