#!/usr/bin/env bash
# Install a single-machine Slurm (slurmctld + slurmd + slurmdbd + client tools) and munge for the
# Slurm executor tests (tests/tuner/test_slurm.py, test_slurm_steps.py). Debian/Ubuntu, run as root.
# Idempotent: does nothing when slurmctld, slurmd, slurmdbd and munged are already on PATH. It only
# installs: the tests configure, start and stop their own daemons with a test-owned slurm.conf and
# slurmdbd.conf (tests/slurm/cluster.py, tests/slurm/accounting.py), so the packages' own services
# are kept from starting (policy-rc.d) and no /etc/slurm/slurm.conf is needed. slurmdbd (accounting,
# so sacct shows jobs and steps) also needs a MySQL/MariaDB server on 127.0.0.1:3306, user root with
# no password; this script does not install one (the tests run without accounting when none answers).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
        && command -v slurmdbd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-slurm.sh: must run as root (apt-get install slurm-wlm slurmdbd munge)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-slurm.sh: needs apt-get (Debian/Ubuntu); install slurm-wlm, slurmdbd and munge another way" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
policy=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
    if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi
    rm -f "$log"
}
trap cleanup EXIT
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"   # 101: "action forbidden" for invoke-rc.d
    chmod +x "$policy"
    created_policy=1
fi
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm slurmdbd munge; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-slurm.sh: apt-get failed" >&2
    exit 1
fi
for exe in slurmctld slurmd slurmdbd munged sbatch srun squeue scontrol scancel sinfo sacct sacctmgr; do
    command -v "$exe" >/dev/null || { echo "install-slurm.sh: $exe missing after install" >&2; exit 1; }
done
echo "install-slurm.sh: $(slurmctld -V) and munge $(dpkg-query -W -f='${Version}' munge) installed"
