/* cli.h - what every kinfer command shares: the -c FILE and --set K=V
 * options, loading and validating the config and applying its log
 * settings, the one stop flag the signal handlers set, and number
 * options. Each command parses its own other options.
 *
 * Threads: the main thread of a command; cli_stop is written only by the
 * signal handlers and read by whoever was handed it. */
#ifndef KINFER_CLI_H
#define KINFER_CLI_H

#include <signal.h>
#include <stddef.h>

#include "../config/config.h"

/* The one global: nonzero once SIGINT or SIGTERM arrived (after
 * cli_install_signals). Commands hand its address down as their stop
 * flag. */
extern volatile sig_atomic_t cli_stop;

/* SIGINT and SIGTERM set cli_stop and do nothing else; SIGPIPE is ignored
 * (a peer closing a socket must fail a write, not kill the process). */
void cli_install_signals(void);

/* -c FILE and every --set, as given. */
struct cli_config {
    const char *path;   /* borrowed from argv; NULL until -c */
    const char **sets;  /* borrowed from argv, in order */
    size_t n_sets, cap;
};

/* Room for every --set of an argv of argc entries. Returns 0, or -1 when
 * out of memory. */
int cli_config_init(struct cli_config *cc, int argc);
void cli_config_fini(struct cli_config *cc);

/* The getopt cases every command with a config takes: 'c' and 's'.
 * Returns 1 when ch was one of them (and takes arg, borrowed), else 0. */
int cli_config_opt(struct cli_config *cc, int ch, const char *arg);
/* Their long options, for a command's struct option table. */
#define CLI_CONFIG_OPTIONS \
    {"config", required_argument, 0, 'c'}, {"set", required_argument, 0, 's'}

/* Loads cc->path with its --set overrides (in order) and applies
 * log.level and log.format to the process's logger. On failure prints
 * "kinfer CMD: why" to stderr and returns NULL. Returns a new config
 * (cfg_destroy frees it). */
struct kcfg *cli_config_load(const char *cmd, const struct cli_config *cc);

/* Parses an integer option value within lo..hi; prints "kinfer CMD:
 * --OPT: ..." to stderr and returns -1 when it is not one. */
int cli_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi,
                   long *out);

#endif
