#!/usr/bin/env bash
# A throw-away, real SLURM cluster on this one machine, so that tests (and you) can sbatch the
# real scripts/multinode_trainer.slurm: Debian's slurm-wlm 22.05 + munge, one slurmctld and N
# slurmd daemons that emulate nodes node1..nodeN (all on 127.0.0.1, distinct ports, sharing this
# machine's CPUs). Needs root (SlurmUser=root); installs the packages with apt when missing.
#
#   scripts/local_slurm.sh start [--nodes N] [--dir DIR]   # prints `export SLURM_CONF=...`
#   scripts/local_slurm.sh stop  [--dir DIR]                # stops only the daemons it started
#   scripts/local_slurm.sh env   [--dir DIR]
#   scripts/local_slurm.sh install                          # the packages only (.ci/run)
#
#   eval "$(scripts/local_slurm.sh start --nodes 2)"; sbatch --wait ...; scripts/local_slurm.sh stop
#
# Facts this relies on: munged refuses a socket folder that is not world-executable;
# MinJobAge must be small (4) or `sbatch --wait` polls at 2, 10, 42 s... and notices the end of a
# job late; there is no accounting database (no sacct: use `sbatch --wait`'s exit code); node
# names do not resolve (NodeAddr=127.0.0.1 does: multinode_trainer.slurm uses the NodeAddr).
set -euo pipefail

cmd=${1:-}; [[ $# -gt 0 ]] && shift
nodes=2
dir=${LOCAL_SLURM_DIR:-/tmp/titanlite_slurm}
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) nodes=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        *) echo "local_slurm.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
dir=$(realpath -m "$dir")
conf=$dir/slurm.conf
# munged refuses a socket whose every parent folder is not world-executable (a pytest tmp_path
# is 0700): the socket lives in /tmp, named after $dir.
sockdir=/tmp/titanlite-munge-$(cksum <<<"$dir" | cut -d' ' -f1)
sock=$sockdir/munge.socket
say() { echo "[local_slurm] $*" >&2; }
die() { say "error: $*"; exit 1; }

# The pid recorded for NAME if that process is still ours and alive. Identity is the pid plus its
# start time (field 22 of /proc/PID/stat, fixed at fork): a recycled pid belongs to somebody else
# and must never be killed. Not the command line: just after spawn the child may not have exec'd
# yet and still shows this script's, which once read as "slurmctld exited" on a loaded machine.
start_time() {  # start_time PID: prints "STATE STARTTIME", fails if PID is gone
    local stat
    stat=$(cat /proc/"$1"/stat 2>/dev/null) || return 1
    stat=${stat##*) }  # comm may hold spaces and parentheses; the fields after it do not
    awk '{print $1, $20}' <<<"$stat"
}

our_pid() {
    local f=$dir/pids/$1.pid pid started now
    [[ -f $f ]] && read -r pid started <"$f" && [[ -n ${started:-} ]] || return 1
    now=$(start_time "$pid") || return 1
    [[ ${now% *} != Z && ${now#* } == "$started" ]] || return 1
    echo "$pid"
}

spawn() {  # spawn NAME CMD...: detached (own session, no inherited fds), pid recorded
    local name=$1 pid now; shift
    setsid "$@" </dev/null >"$dir/log/$name.out" 2>&1 &
    pid=$!
    now=$(start_time "$pid") || now="gone -"
    echo "$pid ${now#* }" >"$dir/pids/$name.pid"
}

wait_until() {  # wait_until NAME CMD...: poll every 0.2 s for up to 60 s while NAME lives
    local name=$1 i; shift
    for ((i = 0; i < 300; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        our_pid "$name" >/dev/null || die "$name exited (logs: $dir/log): $(tail -n 3 "$dir"/log/"$name"* 2>/dev/null)"
        sleep 0.2
    done
    die "timed out waiting for $name (logs: $dir/log)"
}

install_if_missing() {
    local b
    for b in slurmctld slurmd sbatch scontrol munged; do
        command -v "$b" >/dev/null && continue
        command -v apt-get >/dev/null || die "SLURM is not installed and there is no apt-get"
        say "installing slurmctld slurmd slurm-client munge (apt-get)..."
        export DEBIAN_FRONTEND=noninteractive
        local pkgs=(slurmctld slurmd slurm-client munge)
        apt-get install -y --no-install-recommends "${pkgs[@]}" >"$dir.apt.log" 2>&1 ||
            { apt-get update >>"$dir.apt.log" 2>&1 &&
              apt-get install -y --no-install-recommends "${pkgs[@]}" >>"$dir.apt.log" 2>&1; } ||
            die "apt-get install failed; see $dir.apt.log"
        return
    done
}

node_names() { seq -f 'node%g' 1 "$nodes"; }
idle() { [[ $(SLURM_CONF=$conf sinfo -h -N -o '%T' | grep -c '^idle$') == "$nodes" ]]; }

start() {
    [[ $nodes =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer"
    [[ $(id -u) == 0 ]] || die "needs root (the daemons run as SlurmUser=root)"
    [[ $dir != / ]] || die "refusing --dir /"
    install_if_missing
    our_pid slurmctld >/dev/null && die "a cluster already runs from $dir (stop it first)"
    rm -rf "$dir"
    rm -rf "$sockdir"
    mkdir -p "$dir"/{state,key,pids,log} "$sockdir"
    chmod 700 "$dir/key"; chmod 755 "$sockdir"
    # slurmctld on $port, node i's slurmd on $port + i: a free range near a random base, so that
    # two clusters (or a leftover one) do not collide.
    local port i busy
    for ((i = 0; i < 50; i++)); do
        port=$((20000 + RANDOM % 20000))
        busy=$(ss -Htln 2>/dev/null | awk -v lo="$port" -v hi=$((port + nodes)) \
            '{n = split($4, a, ":"); p = a[n] + 0; if (p >= lo && p <= hi) print p}')
        [[ -z $busy ]] && break
    done
    local hw cpus mem
    hw=$(slurmd -C | head -1)
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
    mem=$(( $(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw") * 9 / 10 / nodes ))
    cat >"$conf" <<EOF
# written by titanlite scripts/local_slurm.sh
ClusterName=titanlite
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/state/slurmctld.pid
SlurmdPidFile=$dir/spool/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=10
InactiveLimit=0
MinJobAge=4
MailProg=/bin/true
EOF
    i=0
    for n in $(node_names); do
        i=$((i + 1))
        mkdir -p "$dir/spool/$n"
        echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((port + i)) CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$conf"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$conf"

    trap 'say "start failed"; tail -n 5 "$dir"/log/* >&2 || true; stop' ERR
    dd if=/dev/urandom of="$dir/key/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/key/munge.key"
    spawn munged munged -F --socket="$sock" --key-file="$dir/key/munge.key" \
        --pid-file="$sockdir/munged.pid" --seed-file="$dir/key/seed" --log-file="$dir/log/munged.log"
    wait_until munged bash -c "munge -n -S '$sock' | unmunge -S '$sock'"
    spawn slurmctld slurmctld -D -f "$conf"
    wait_until slurmctld bash -c "SLURM_CONF='$conf' scontrol ping | grep -q UP"
    for n in $(node_names); do spawn "slurmd-$n" slurmd -D -f "$conf" -N "$n"; done
    wait_until "slurmd-node1" idle
    trap - ERR
    say "up: $nodes node(s), slurmctld port $port, $dir"
    echo "export SLURM_CONF=$conf"
}

stop_pid() {  # TERM, up to 10 s, then KILL
    local pid i
    pid=$(our_pid "$1") || { rm -f "$dir/pids/$1.pid"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do our_pid "$1" >/dev/null || break; sleep 0.2; done
    our_pid "$1" >/dev/null && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/pids/$1.pid"
}

stop() {
    local f i
    if our_pid slurmctld >/dev/null; then
        # Jobs first, so that no slurmstepd outlives its slurmd.
        SLURM_CONF=$conf scancel --full --quiet -u root 2>/dev/null || true
        for ((i = 0; i < 75; i++)); do
            [[ -z $(SLURM_CONF=$conf squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    for f in "$dir"/pids/slurmd-*.pid; do [[ -e $f ]] && stop_pid "$(basename "$f" .pid)"; done
    stop_pid slurmctld
    stop_pid munged
    rm -rf "$sockdir"
    say "stopped (logs kept in $dir/log)"
}

case $cmd in
    start) start ;;
    install)
        [[ $(id -u) == 0 ]] || die "needs root to install the packages"
        install_if_missing ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$conf" ;;
    *) sed -n '2,/^set -euo/{/^#/p}' "$0" >&2; exit 2 ;;
esac
