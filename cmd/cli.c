/* cli.c - the command-line plumbing every kinfer command shares (see
 * cli.h): the config options, the config load with the log set-up, the
 * signal handlers and the one stop flag.
 *
 * Threads: the main thread of a command; the signal handlers only set
 * cli_stop. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/log.h"

volatile sig_atomic_t cli_stop;

/* Only sets the flag: everything else happens on the command's thread. */
static void cli_on_signal(int sig)
{
    (void)sig;
    cli_stop = 1;
}

void cli_install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = cli_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* argc bounds the number of --set a command line can hold. */
int cli_config_init(struct cli_config *cc, int argc)
{
    memset(cc, 0, sizeof(*cc));
    cc->cap = argc > 0 ? (size_t)argc : 1;
    cc->sets = calloc(cc->cap, sizeof(*cc->sets));
    return cc->sets ? 0 : -1;
}

void cli_config_fini(struct cli_config *cc)
{
    free(cc->sets);
    memset(cc, 0, sizeof(*cc));
}

int cli_config_opt(struct cli_config *cc, int ch, const char *arg)
{
    if (ch == 'c') {
        cc->path = arg;
        return 1;
    }
    if (ch == 's' && cc->n_sets < cc->cap) {
        cc->sets[cc->n_sets++] = arg;
        return 1;
    }
    return 0;
}

/* The config decides the log level and format, so logging is set up the
 * moment it is read, before the command does anything worth logging. */
struct kcfg *cli_config_load(const char *cmd, const struct cli_config *cc)
{
    if (!cc->path) {
        fprintf(stderr, "kinfer %s: -c FILE is required\n", cmd);
        return NULL;
    }
    char err[1024];
    struct kcfg *c = cfg_load(cc->path, cc->sets, cc->n_sets, err, sizeof(err));
    if (!c) {
        fprintf(stderr, "kinfer %s: %s\n", cmd, err);
        return NULL;
    }
    log_level_parse(c->log.level, &log_threshold);
    log_fmt = strcmp(c->log.format, "json") == 0 ? LOG_JSON : LOG_TEXT;
    return c;
}

int cli_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi,
                   long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "kinfer %s: %s: '%s' is not an integer in %ld..%ld\n", cmd, opt, s, lo,
                hi);
        return -1;
    }
    *out = v;
    return 0;
}
