#!/usr/bin/env bash
# Record what one Slurm version really prints and hands to hooks, into tests/data/slurm-<version>/ (the parsers'
# test inputs): a cluster of that version (scripts/cluster.sh, own directory and ports) whose five hooks are
# replaced by probes that save their environment (and `scontrol show job -o` in the epilogs), then jobs that
# complete, fail, are cancelled and time out, a root submission with --uid/--gid, an AdminComment update, shard
# placements, and the machine-readable outputs (scontrol -o/-od/--json, squeue --json, sinfo --json, sbatch --parsable).
# Usage (root): scripts/record_slurm.sh 22.05|24.11|26.05 [out dir]   (about 2 minutes: one job runs into -t 1)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
V=${1:?usage: record_slurm.sh <version> [out dir]}
OUT=${2:-$REPO/tests/data/slurm-$V}
export COLOC_SLURM=$V COLOC_CLUSTER_DIR=/tmp/coloc-record-$V COLOC_PORT_BASE=${COLOC_PORT_BASE:-$((24000 + ${V%%.*} * 10))}
D=$COLOC_CLUSTER_DIR
export SLURM_CONF=$D/etc/slurm.conf
"$REPO/scripts/cluster.sh" stop >/dev/null 2>&1 || true
rm -rf "$D"
"$REPO/scripts/cluster.sh" start
trap '"$REPO/scripts/cluster.sh" stop >/dev/null 2>&1 || true' EXIT
eval "$("$REPO/scripts/cluster.sh" env)"
B=$COLOC_SLURM_BIN
mkdir -p "$OUT" "$D/hookenv"; chmod 0777 "$D/hookenv"
# Probe hooks: the environment as Slurm hands it (before anything is set), then scontrol's view in epilogs.
for h in prolog epilog prolog_slurmctld epilog_slurmctld task_prolog; do
  cat > "$D/etc/hooks/$h.sh" <<EOF
#!/bin/sh
env | LC_ALL=C sort > $D/hookenv/$h-\$SLURM_JOB_ID.env
case $h in epilog*|prolog*)
  SLURM_CONF=$SLURM_CONF $B/scontrol show job -o \$SLURM_JOB_ID > $D/hookenv/$h-\$SLURM_JOB_ID.scontrol 2>&1
  SLURM_CONF=$SLURM_CONF $B/scontrol show job -od \$SLURM_JOB_ID > $D/hookenv/$h-\$SLURM_JOB_ID.scontrol_d 2>&1 ;;
esac
case $h in epilog*)  # the JSON view of the job (22.05: no scontrol --json; squeue --json lists all jobs)
  SLURM_CONF=$SLURM_CONF $B/scontrol show job --json \$SLURM_JOB_ID > $D/hookenv/$h-\$SLURM_JOB_ID.json 2>/dev/null ||
    SLURM_CONF=$SLURM_CONF $B/squeue --json > $D/hookenv/$h-\$SLURM_JOB_ID.json 2>&1 ;;
esac
exit 0
EOF
  chmod 0755 "$D/etc/hooks/$h.sh"
done
J=$D/jobs
as_user() {  # a clean login-like environment (nothing of the recording machine's own goes into the records)
  (cd "$J" && runuser -u colocuser -- env -i HOME=/home/colocuser USER=colocuser LOGNAME=colocuser SHELL=/bin/bash \
    LANG=C.UTF-8 SLURM_CONF="$SLURM_CONF" PATH="$B:/usr/bin:/bin" "$@")
}
submit() { as_user "$B/sbatch" --parsable "$@"; }
state() { "$B/scontrol" show job -o "$1" | tr ' ' '\n' | sed -n 's/^JobState=//p'; }
wait_state() {  # <id> <regex> [timeout s]
  local i
  for i in $(seq $((${3:-60} * 5))); do state "$1" | grep -Eq "^($2)$" && return 0; sleep 0.2; done
  echo "record_slurm: job $1 never reached $2 (is $(state "$1"))" >&2; return 1
}

# A running shard job (the parsers' main inputs).
run=$(submit -J small --gres=shard:5 -o "$J/%j.out" -e "$J/%j.err" --comment='coloc={"a":1}' --wrap 'sleep 8')
echo "$run" > "$OUT/sbatch_parsable.txt"
wait_state "$run" RUNNING
"$B/scontrol" show job -o "$run" > "$OUT/scontrol_show_job_o_running_shard.txt"
"$B/scontrol" show job -od "$run" > "$OUT/scontrol_show_job_od_running_shard.txt"
"$B/scontrol" show job --json "$run" > "$OUT/scontrol_show_job_json_running_shard.json" 2>&1 ||
  echo "(rc $?)" >> "$OUT/scontrol_show_job_json_running_shard.json"
"$B/squeue" --json > "$OUT/squeue_json_running.json"
"$B/sinfo" --json > "$OUT/sinfo.json"
as_user "$B/sbatch" --gres=gpu:1,shard:5 --wrap true > "$OUT/sbatch_error_invalid_gres.txt" 2>&1 || true
# AdminComment: set by root while the job runs, read back (scontrol text and squeue JSON).
"$B/scontrol" update jobid="$run" AdminComment='coloc={"mode":"shard","shards":5}'
{ "$B/scontrol" show job -o "$run" | grep -o 'AdminComment=.*StdErr' || true
  "$B/squeue" --json | python3 -c "import json,sys; print([j.get('admin_comment') for j in json.load(sys.stdin)['jobs'] if j['job_id']==$run])"
} > "$OUT/admin_comment.txt"

# Jobs that fail, are cancelled, time out; one OOM-like failure.
fail=$(submit -J fail -o "$J/%j.out" --wrap 'exit 3')
kill9=$(submit -J kill9 -o "$J/%j.out" --wrap 'kill -9 $$')
cancel=$(submit -J cancel -o "$J/%j.out" --wrap 'sleep 300')
tmo=$(submit -J timeout -t 1 -o "$J/%j.out" --wrap 'sleep 300')
wait_state "$cancel" RUNNING
"$B/scancel" "$cancel"
wait_state "$run" COMPLETED
# sbatch --uid/--gid as root (the OOM rerun's submission on the user's behalf).
{ echo "## root: sbatch --parsable --uid=2001 --gid=2001 --wrap id"
  (cd "$J" && env -i HOME=/root PATH="$B:/usr/bin:/bin" SLURM_CONF="$SLURM_CONF" \
    "$B/sbatch" --parsable --uid=2001 --gid=2001 -o "$J/uid-%j.out" --wrap id 2>&1; echo "rc=$?")
} > "$OUT/sbatch_uid_gid.txt"
uid_job=$(grep -Eo '^[0-9]+' "$OUT/sbatch_uid_gid.txt" | head -1 || true)

# Shards: two shard:5 jobs (same GPU?), one shard:100 (more than one GPU holds), and gpu:1 beside shards.
s1=$(submit -J s1 --gres=shard:5 -w n2 -o /dev/null --wrap 'sleep 6')
s2=$(submit -J s2 --gres=shard:5 -w n2 -o /dev/null --wrap 'sleep 6')
s3=$(submit -J s100 --gres=shard:100 -w n2 -o /dev/null --wrap 'sleep 6' 2>&1 || true)
sleep 3
"$B/squeue" --json -j "$s1" > "$OUT/squeue_json_job_filter.json" 2>&1 || true
{ for j in $s1 $s2 $s3; do
    case "$j" in *[!0-9]*) echo "shard:100 sbatch: $j"; continue ;; esac
    "$B/scontrol" show job -od "$j" | tr ' ' '\n' | grep -E '^(JobId|JobName|JobState|Reason|GRES|TresPerNode|JOB_GRES)=' | tr '\n' ' '; echo
  done
  "$B/scontrol" show config | grep -E '^(SelectTypeParameters|SLURM_VERSION)'
  "$B/scontrol" show node n2 | grep -E 'Gres|AllocTRES'
} > "$OUT/shards.txt"
wait_state "$tmo" 'TIMEOUT' 150
for j in $fail $kill9 $cancel $s1 $s2 $uid_job; do wait_state "$j" 'COMPLETED|FAILED|CANCELLED|TIMEOUT' 60; done
if [ -n "$uid_job" ]; then
  { echo "## the job's output (id)"; cat "$J/uid-$uid_job.out"; "$B/scontrol" show job -o "$uid_job" | grep -Eo '(UserId|GroupId)=[^ ]*'
  } >> "$OUT/sbatch_uid_gid.txt"
fi
sleep 2
# What each hook saw, per job (env and scontrol), and a summary of the states epilogs see.
HE=$OUT/hook_env; rm -rf "$HE"; mkdir -p "$HE"
for f in "$D"/hookenv/*; do
  b=$(basename "$f"); id=$(echo "$b" | grep -Eo '[0-9]+' | tail -1)
  case $id in "$run") tag=completed ;; "$fail") tag=failed ;; "$kill9") tag=killed ;; "$cancel") tag=cancelled ;;
    "$tmo") tag=timeout ;; "$uid_job") tag=uid ;; *) continue ;; esac
  cp "$f" "$HE/${b%%-*}-$tag.${b##*.}"
done
{ echo "# context job: SLURM_JOB_STATE SLURM_JOB_EXIT_CODE SLURM_JOB_EXIT_CODE2 SLURM_JOB_DERIVED_EC | scontrol JobState ExitCode | job_state in scontrol --json (squeue --json on 22.05)"
  for tag in completed failed killed cancelled timeout; do
    for h in epilog epilog_slurmctld; do
      f=$HE/$h-$tag.env; [ -f "$f" ] || { echo "$h $tag: (hook did not run)"; continue; }
      v() { sed -n "s/^$1=//p" "$f"; }
      sc=$(tr ' ' '\n' < "$HE/$h-$tag.scontrol" | grep -E '^(JobState|ExitCode)=' | tr '\n' ' ')
      js=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print([j.get("job_state") for j in d["jobs"] if j["job_id"]==int(sys.argv[2])])' "$HE/$h-$tag.json" "$(v SLURM_JOB_ID)" 2>&1 | tail -1)
      echo "$h $tag: STATE=$(v SLURM_JOB_STATE) EC=$(v SLURM_JOB_EXIT_CODE) EC2=$(v SLURM_JOB_EXIT_CODE2) DERIVED=$(v SLURM_JOB_DERIVED_EC) | $sc| json job_state=$js"
    done
  done
} > "$OUT/epilog_states.txt"
"$B/sacct" -j "$run" > "$OUT/sacct.txt" 2>&1 || echo "rc=$?" >> "$OUT/sacct.txt"
"$B/scontrol" show config > "$OUT/scontrol_show_config.txt"
cp "$D/etc/slurm.conf" "$OUT/slurm.conf"
echo "record_slurm: $V -> $OUT ($(ls "$OUT" | wc -l) files, $(ls "$HE" | wc -l) hook records)"
