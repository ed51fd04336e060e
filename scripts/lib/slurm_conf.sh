# Shared setup and Slurm config writers of the local clusters: sourced (bash) by scripts/cluster.sh (test/demo
# cluster) and benchmarks/device/cluster_gpu.sh (device harness). Each slurm_conf_* function prints to stdout or
# writes the named file; every value that differs between the two clusters is an argument.

# ensure_users: the job users colocuser (uid 2001) and colocuser2 (2002), created where missing (a cluster
# started beside this one may create them at the same moment: its useradd winning is no failure).
ensure_users() {
  local u uid
  for u in colocuser:2001 colocuser2:2002; do
    uid=${u#*:}; u=${u%%:*}
    id -u "$u" >/dev/null 2>&1 || useradd -m -u "$uid" -s /bin/bash "$u" 2>/dev/null || id -u "$u" >/dev/null \
      || { echo "cannot create user $u" >&2; return 1; }
  done
}

# slurm_conf_hooks <hooks dir> <coloc.yaml> <slurm.conf> <coloc-hook> <shim dir> [comment]
# Writes the five wrappers (prolog.sh ... task_prolog.sh) that hand the project's shims <shim dir>/<name> this
# cluster's config (Slurm runs hooks without PATH/SLURM_CONF); [comment] becomes line 2 when given. The pending
# directory of hook runs that could not record (hooks/pending.py) is <dir>/coloc/pending for <dir>/etc/coloc.yaml,
# next to the state and run directories of slurm_conf_coloc_yaml: one per cluster, never the host-wide default.
# The TaskProlog's shim takes <coloc-hook> as its argument (--hook=), never from COLOC_HOOK (the job's
# environment, which the user fills).
slurm_conf_hooks() {
  local dir=$1 yaml=$2 conf=$3 hook=$4 shims=$5 comment=${6:-} name
  local pending
  pending=$(dirname "$(dirname "$yaml")")/coloc/pending
  for name in prolog.sh epilog.sh prolog_slurmctld.sh epilog_slurmctld.sh task_prolog.sh; do
    { echo "#!/bin/sh"
      [ -z "$comment" ] || echo "$comment"
      cat <<HOOK
COLOC_CONFIG=$yaml SLURM_CONF=$conf COLOC_HOOK=$hook COLOC_PENDING_DIR=$pending
export COLOC_CONFIG SLURM_CONF COLOC_HOOK COLOC_PENDING_DIR
exec $shims/$name $([ "$name" != task_prolog.sh ] || echo "--hook=$hook ")"\$@"
HOOK
    } > "$dir/$name"
    chmod 0755 "$dir/$name"
  done
}

# slurm_conf_common <cluster> <host> <port> <auth info> <plugin dir or ""> <dir> <sched interval s> [version]
# Prints slurm.conf from ClusterName to TaskProlog: state, spool, pids and logs under <dir>, the hooks that
# slurm_conf_hooks wrote under <dir>/etc/hooks. Nodes and partition follow (slurm_conf_node, slurm_conf_partition).
# [version] (22.05, 24.11, 26.05; default 22.05) picks the keys that differ per Slurm release
# (docs/slurm-versions.md).
slurm_conf_common() {
  local cluster=$1 host=$2 port=$3 auth=$4 plugins=$5 d=$6 sched=$7 version=${8:-22.05}
  cat <<CONF
ClusterName=$cluster
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=$auth
CONF
  [ -z "$plugins" ] || echo "PluginDir=$plugins"
  cat <<CONF
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu,shard
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$d/log/jobcomp.txt
JobRequeue=0
MinJobAge=86400
MaxJobCount=100000
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_interval=$sched,bf_interval=$sched,default_queue_depth=500
PrologEpilogTimeout=120
Prolog=$d/etc/hooks/prolog.sh
Epilog=$d/etc/hooks/epilog.sh
PrologSlurmctld=$d/etc/hooks/prolog_slurmctld.sh
EpilogSlurmctld=$d/etc/hooks/epilog_slurmctld.sh
TaskProlog=$d/etc/hooks/task_prolog.sh
CONF
}

# slurm_conf_node <node> <host> <port> <cpus> <gpus> <shards>: the slurm.conf line of one node on 127.0.0.1.
# With COLOC_GRES_TYPED=1 the GRES are typed per GPU (gpu:g0:1,...,shard:g0:<shards/gpus>,...), as slurm_conf_gres.
slurm_conf_node() {
  local gres="gpu:$5,shard:$6" i
  if [ "${COLOC_GRES_TYPED:-0}" = 1 ]; then
    gres=""
    for i in $(seq 0 $(($5 - 1))); do gres="$gres,gpu:g$i:1"; done
    for i in $(seq 0 $(($5 - 1))); do gres="$gres,shard:g$i:$(($6 / $5))"; done
    gres=${gres#,}
  fi
  echo "NodeName=$1 NodeHostname=$2 NodeAddr=127.0.0.1 Port=$3 CPUs=$4 RealMemory=16000 Gres=$gres"
}

# slurm_conf_partition: the one partition, all nodes.
slurm_conf_partition() {
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

# slurm_conf_gres <node> <gpus> <shards per GPU> <device prefix>: the gres.conf lines of one node, GPU i being
# <device prefix>i (AutoDetect=off is the caller's first line). With COLOC_GRES_TYPED=1 each GPU and its shards get
# the type g<i> (gpu:g0, shard:g0, ...), so coloc-placer can steer a shard job to one GPU (docs/design.md).
slurm_conf_gres() {
  local node=$1 n=$2 per=$3 dev=$4 i
  if [ "${COLOC_GRES_TYPED:-0}" = 1 ]; then
    for i in $(seq 0 $((n - 1))); do
      echo "NodeName=$node Name=gpu Type=g$i File=${dev}$i"
      echo "NodeName=$node Name=shard Type=g$i Count=$per File=${dev}$i"
    done
    return 0
  fi
  if [ "$n" = 1 ]; then echo "NodeName=$node Name=gpu File=${dev}0"; else echo "NodeName=$node Name=gpu File=${dev}[0-$((n - 1))]"; fi
  for i in $(seq 0 $((n - 1))); do echo "NodeName=$node Name=shard Count=$per File=${dev}$i"; done
}

# slurm_conf_coloc_yaml <comment> <dir> <slurm bin dir> <GiB per GPU>: the common keys of coloc.yaml (state, run
# and logs under <dir>), after a "# <comment>" line; the caller appends any further keys.
slurm_conf_coloc_yaml() {
  cat <<YAML
# $1
state_dir: $2/coloc/state
run_dir: $2/coloc/run
log_dir: $2/log
slurm_bin_dir: $3
gpu_mem_gib: $4
oom_rerun_per_user_max: 1000  # test/demo cluster: its tests rerun many OOM jobs of one user
probe: false  # test/demo cluster: its jobs declare #COLOC lines; the probe's own tests set COLOC_PROBE=true
YAML
}
