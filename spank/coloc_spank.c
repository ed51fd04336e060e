/*
 * coloc_spank.c - SPANK plugin for slurm-coloc.
 *
 * Copyright (c) the slurm-coloc authors. Licensed under the Apache License,
 * Version 2.0 (see setup.cfg). Built against Slurm 22.05 <slurm/spank.h>.
 *
 * Adds --coloc-mem=SIZE|auto and --coloc-share=mps|timeslice|exclusive to
 * sbatch/salloc/srun. In the allocator and local contexts the normalized
 * values go to the job control environment (the Prolog/Epilog see
 * SPANK_COLOC_MEM and SPANK_COLOC_SHARE). In the remote context (slurmstepd)
 * the tasks get COLOC_SHARE and the CUDA_MPS_* / COLOC_* pairs the node
 * Prolog wrote to <run_dir>/jobs/<job id>.env. Remote hooks never fail the
 * step: errors are logged and the job runs unshared.
 */

#define _GNU_SOURCE	/* program_invocation_short_name */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(coloc, 1);

#define COLOC_ENV_MEM         "COLOC_MEM"
#define COLOC_ENV_SHARE       "COLOC_SHARE"
#define COLOC_RUN_DIR_DEFAULT "/run/slurm-coloc"
#define COLOC_ARG_RUN_DIR     "run_dir="
#define COLOC_MAX_MIB         (1024ULL * 1024ULL) /* 1 TiB */
#define COLOC_LINE_MAX        4096                /* longer lines: ignored */
#define COLOC_FILE_MAX        (1024 * 1024)       /* bigger file: skipped */
#ifndef COLOC_VERSION
#define COLOC_VERSION         "unknown"           /* Makefile passes -D */
#endif

enum { OPT_MEM = 1, OPT_SHARE = 2 };

/* Defaults, overridden by plugstack.conf arguments in slurm_spank_init. */
static char run_dir[PATH_MAX] = COLOC_RUN_DIR_DEFAULT;
/* Normalized option values; "" means "not given". */
static char mem_value[24];
static char share_value[16];

/* The client's parsed options (sbatch/salloc/srun); weak: absent elsewhere. */
struct slurm_opt;
extern struct slurm_opt opt __attribute__((weak));
extern bool slurm_option_isset(struct slurm_opt *o, const char *name)
	__attribute__((weak));

static int _opt_cb(int val, const char *optarg, int remote);
static int _parse_args(int ac, char **av);
static int _parse_mem(const char *arg, char *out, size_t outlen,
		      const char **why);
static void _warn_without_gres(void);
static void _put(spank_t sp, bool hooks, const char *name,
		 const char *value);
static void _load_env_file(spank_t sp);
static bool _key_allowed(const char *key);

static struct spank_option spank_options_table[] = {
	{ "coloc-mem", "SIZE|auto",
	  "[coloc] GPU memory to reserve: SIZE like 6G, 6144M, 6GiB (plain "
	  "number = GiB, 1M..1T) or 'auto' (ask the estimator). Use with "
	  "--gres=shard:<GiB>, or submit with coloc-sbatch.",
	  1, OPT_MEM, _opt_cb },
	{ "coloc-share", "mps|timeslice|exclusive",
	  "[coloc] How to share the GPU: mps (CUDA MPS), timeslice (no MPS, "
	  "time slicing) or exclusive (a whole GPU).",
	  1, OPT_SHARE, _opt_cb },
	SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	struct spank_option *o;
	bool strict;
	int rc = 0;

	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR && ctx != S_CTX_REMOTE)
		return 0;	/* slurmd, prolog/epilog: nothing to do */
	slurm_debug("coloc: spank plugin %s", COLOC_VERSION);
	/* A bad plugstack.conf fails new submissions (sbatch, salloc, srun
	 * outside a job), never steps of jobs that are already running. */
	strict = ctx == S_CTX_ALLOCATOR
		 || (ctx == S_CTX_LOCAL && getenv("SLURM_JOB_ID") == NULL);
	if (_parse_args(ac, av) < 0) {
		if (strict)
			return -1;
		slurm_error("coloc: bad plugstack.conf arguments ignored, "
			    "run_dir=%s", run_dir);
	}
	for (o = spank_options_table; o->name; o++) {
		spank_err_t err = spank_option_register(sp, o);
		if (err != ESPANK_SUCCESS) {
			slurm_error("coloc: spank_option_register(--%s): %s",
				    o->name, spank_strerror(err));
			if (strict)
				rc = -1;
		}
	}
	return rc;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	(void) ac;
	(void) av;
	if (ctx == S_CTX_REMOTE) {
		/* slurmstepd, still root (reads a 0600 env file too); tasks of
		 * this step inherit what is set here. */
		_put(sp, false, COLOC_ENV_SHARE, share_value);
		_load_env_file(sp);
		return 0;	/* whatever happened, the job runs */
	}
	if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL)
		return 0;
	_put(sp, true, COLOC_ENV_MEM, mem_value);
	_put(sp, true, COLOC_ENV_SHARE, share_value);
	if (mem_value[0] != '\0')
		_warn_without_gres();
	return 0;
}

/*
 * Option callback, shared by both options (told apart by val). Slurm may call
 * it more than once (#SBATCH line, then command line, then again in
 * slurmstepd); the last value wins, as for Slurm's own options.
 */
static int _opt_cb(int val, const char *optarg, int remote)
{
	static const char *const modes[] = { "mps", "timeslice", "exclusive" };
	const char *arg = optarg ? optarg : "", *why = "unknown option";
	size_t i;

	if (val == OPT_MEM
	    && _parse_mem(arg, mem_value, sizeof(mem_value), &why) == 0) {
		/* A bare number is GiB (shards), unlike sbatch --mem's MB: say so at submission. */
		if (!remote && *arg && isdigit((unsigned char) arg[strlen(arg) - 1]))
			slurm_info("coloc: --coloc-mem %s is read as %s GiB (sbatch --mem %s would be MB); "
				   "write %sG to say so", arg, arg, arg, arg);
		return 0;
	}
	for (i = 0; val == OPT_SHARE && i < sizeof(modes) / sizeof(*modes); i++)
		if (strcasecmp(arg, modes[i]) == 0) {
			snprintf(share_value, sizeof(share_value), "%s",
				 modes[i]);
			return 0;
		}
	if (val == OPT_SHARE)
		why = "use mps, timeslice or exclusive";
	slurm_error("coloc: invalid --%s value '%s': %s",
		    val == OPT_MEM ? "coloc-mem" : "coloc-share", arg, why);
	/* Submission validated it already; never fail a step over it. */
	return remote ? 0 : -1;
}

/* Reads plugstack.conf arguments: run_dir=/absolute/path. Unknown: error. */
static int _parse_args(int ac, char **av)
{
	const size_t klen = strlen(COLOC_ARG_RUN_DIR);
	int i, rc = 0;

	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], COLOC_ARG_RUN_DIR, klen) == 0
		    && av[i][klen] == '/'
		    && strlen(av[i] + klen) < sizeof(run_dir)) {
			snprintf(run_dir, sizeof(run_dir), "%s", av[i] + klen);
			continue;
		}
		slurm_error("coloc: plugstack.conf: bad argument '%s' (known: "
			    "run_dir=/ABSOLUTE/PATH)", av[i]);
		rc = -1;
	}
	return rc;
}

/*
 * SIZE -> MiB as a decimal string (or "auto"). Grammar as coloc-sbatch's
 * slurm_coloc.units.parse_size_mib: NUMBER[.FRACTION] [K|M|G|T][i][B],
 * case-insensitive, binary units, plain number = GiB, rounded up to MiB.
 * Range 1 MiB .. 1 TiB. Integer arithmetic in KiB, so it is exact.
 */
static int _parse_mem(const char *arg, char *out, size_t outlen,
		      const char **why)
{
	static const char units[] = "KMGT";	/* factors in KiB: 1024^i */
	unsigned long long whole, frac = 0, scale = 1, tail = 0, kib, mib;
	unsigned long long f = 1024ULL * 1024;	/* no unit: GiB */
	const char *p = arg, *u;
	char *end;

	*why = "expected SIZE like 6G, 6144M, 6GiB or 'auto'";
	if (strcasecmp(arg, "auto") == 0)
		return snprintf(out, outlen, "auto") < 0 ? -1 : 0;
	while (isspace((unsigned char) *p))
		p++;
	if (!isdigit((unsigned char) *p))	/* no sign, no "0x" tricks */
		return -1;
	errno = 0;
	whole = strtoull(p, &end, 10);
	if (errno == ERANGE || whole > (1ULL << 31))
		goto too_big;
	p = end;
	if (*p == '.' && isdigit((unsigned char) p[1])) {
		for (p++; isdigit((unsigned char) *p); p++) {
			if (scale < 1000000000ULL) {
				frac = frac * 10 + (unsigned long long) (*p - '0');
				scale *= 10;
			} else if (*p != '0') {
				tail = 1;	/* past the 9th digit: round up */
			}
		}
	}
	while (isspace((unsigned char) *p))
		p++;
	u = *p ? strchr(units, toupper((unsigned char) *p)) : NULL;
	if (u != NULL) {	/* unit letter, optional "i", optional "B" */
		f = 1ULL << (10 * (u - units));
		p += 1 + (toupper((unsigned char) p[1]) == 'I');
		p += (toupper((unsigned char) *p) == 'B');
	}
	while (isspace((unsigned char) *p))
		p++;
	if (*p != '\0')
		return -1;
	/* KiB, rounded up, then MiB rounded up: exact integer arithmetic */
	kib = whole * f + (tail ? frac * f / scale + 1
			       : (frac * f + scale - 1) / scale);
	mib = (kib + 1023) / 1024;
	if (mib == 0) {
		*why = "must be more than 0";
		return -1;
	}
	if (mib > COLOC_MAX_MIB)
		goto too_big;
	return snprintf(out, outlen, "%llu", mib) < 0 ? -1 : 0;
too_big:
	*why = "more than 1T (1048576 MiB)";
	return -1;
}

/* Sets name=value (if given) for the hooks (SPANK_<name>) or the tasks. */
static void _put(spank_t sp, bool hooks, const char *name, const char *value)
{
	spank_err_t err;

	if (value[0] == '\0')
		return;
	err = hooks ? spank_job_control_setenv(sp, name, value, 1)
		    : spank_setenv(sp, name, value, 1);
	if (err == ESPANK_SUCCESS)
		slurm_verbose("coloc: %s %s=%s", hooks ? "job control env" :
			      "task env", name, value);
	else
		slurm_error("coloc: %s(%s): %s", hooks ?
			    "spank_job_control_setenv" : "spank_setenv",
			    name, spank_strerror(err));
}

/*
 * A SPANK plugin cannot add GRES to the job, so --coloc-mem without any GPU
 * request reserves nothing. Warn (do not fail). Asks the client's own option
 * parser (covers the command line, #SBATCH lines and SBATCH_* variables);
 * silently skipped where that parser is not there. coloc-sbatch submitting a
 * job held for coloc-placer (no GRES yet: the placer adds shard:N on the GPU
 * it picks) says so with COLOC_SBATCH_PLACER=1, which is taken out of the
 * environment sbatch passes on to the job.
 */
static void _warn_without_gres(void)
{
	static const char *const gpu_opts[] = {
		"gres", "gpus", "gpus-per-node", "gpus-per-task",
		"gpus-per-socket", "tres-per-task"
	};
	const char *prog = program_invocation_short_name;
	char shards[24] = "N";
	size_t i;

	if (strcmp(prog, "sbatch") && strcmp(prog, "salloc")
	    && strcmp(prog, "srun"))
		return;
	if (!strcmp(prog, "srun") && getenv("SLURM_JOB_ID"))
		return;		/* a step inside an existing allocation */
	if (getenv("COLOC_SBATCH_PLACER")) {
		unsetenv("COLOC_SBATCH_PLACER");
		return;		/* held for coloc-placer, which adds the GRES */
	}
	if (&opt == NULL || slurm_option_isset == NULL)
		return;
	for (i = 0; i < sizeof(gpu_opts) / sizeof(gpu_opts[0]); i++)
		if (slurm_option_isset(&opt, gpu_opts[i]))
			return;
	if (strcmp(mem_value, "auto") != 0)	/* shards are GiB */
		snprintf(shards, sizeof(shards), "%llu",
			 (strtoull(mem_value, NULL, 10) + 1023) / 1024);
	slurm_info("coloc: warning: --coloc-mem without --gres reserves no "
		   "GPU; submit with coloc-sbatch or add --gres=shard:%s",
		   shards);
}

/*
 * Remote context: copy CUDA_MPS_*, COLOC_* and CUDA_VISIBLE_DEVICES pairs from the
 * root-owned env file the node Prolog wrote into the task environment. Absent: nothing
 * (whole-GPU job, or MPS not prepared). Unsafe file: logged and skipped.
 */
static void _load_env_file(spank_t sp)
{
	char path[PATH_MAX], *line = NULL, *eq;
	const char *why;
	uint32_t job_id = 0;
	struct stat st;
	spank_err_t err;
	ssize_t len;
	size_t cap = 0;
	FILE *fp = NULL;
	int fd, n;

	err = spank_get_item(sp, S_JOB_ID, &job_id);
	if (err != ESPANK_SUCCESS) {
		slurm_error("coloc: spank_get_item(S_JOB_ID): %s",
			    spank_strerror(err));
		return;
	}
	n = snprintf(path, sizeof(path), "%s/jobs/%u.env", run_dir, job_id);
	if (n < 0 || (size_t) n >= sizeof(path)) {
		slurm_error("coloc: env file path too long under %s", run_dir);
		return;
	}
	/* O_NONBLOCK: a FIFO planted there must not block slurmstepd. */
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			slurm_debug("coloc: no %s: job runs unshared", path);
		else
			slurm_error("coloc: open(%s): %m", path);
		return;
	}
	if (fstat(fd, &st) < 0) {
		slurm_error("coloc: fstat(%s): %m", path);
		goto done;
	}
	why = !S_ISREG(st.st_mode) ? "not a regular file"
	      : st.st_uid != 0 ? "not owned by root"
	      : (st.st_mode & (S_IWGRP | S_IWOTH)) ? "group/other-writable"
	      : st.st_size > COLOC_FILE_MAX ? "larger than 1 MiB" : NULL;
	if (why != NULL) {
		slurm_error("coloc: %s: %s; ignored (job runs unshared)",
			    path, why);
		goto done;
	}
	fp = fdopen(fd, "r");
	if (fp == NULL) {
		slurm_error("coloc: fdopen(%s): %m", path);
		goto done;
	}
	fd = -1;
	while ((len = getline(&line, &cap, fp)) > 0) {
		if (line[len - 1] == '\n')
			line[--len] = '\0';
		if (len > COLOC_LINE_MAX || strlen(line) != (size_t) len)
			continue;	/* too long, or has a NUL byte */
		eq = strchr(line, '=');
		if (eq == NULL)
			continue;
		*eq = '\0';
		if (!_key_allowed(line)) {
			slurm_debug("coloc: %s: key '%s' ignored", path, line);
			continue;
		}
		_put(sp, false, line, eq + 1);
	}
	if (ferror(fp))
		slurm_error("coloc: read(%s): %m", path);
done:
	free(line);
	if (fp != NULL)
		fclose(fp);
	if (fd >= 0)
		close(fd);
}

/* ^(CUDA_MPS_[A-Z_]+|COLOC_[A-Z_]+|CUDA_VISIBLE_DEVICES)$ */
static bool _key_allowed(const char *key)
{
	static const char *const prefixes[] = { "CUDA_MPS_", "COLOC_" };
	const char *p = NULL;
	size_t i;

	if (strcmp(key, "CUDA_VISIBLE_DEVICES") == 0) /* MPS shows its GPU as 0 */
		return true;

	for (i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]) && !p; i++)
		if (strncmp(key, prefixes[i], strlen(prefixes[i])) == 0)
			p = key + strlen(prefixes[i]);
	if (p == NULL || *p == '\0')
		return false;
	for (; *p; p++)
		if (!((*p >= 'A' && *p <= 'Z') || *p == '_'))
			return false;
	return true;
}
