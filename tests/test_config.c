/* test_config.c - config/config.c: every kind of bad file is refused with
 * its file and line, good files and --set give the values they say, and
 * worker.cfg (the user-facing reference) loads and shows every setting of
 * the table with its default.
 *
 * Single-threaded. Each case writes its file under /tmp and removes it;
 * the worker.cfg case reads it from the cwd, which is the repo root when
 * the Makefile runs the tests. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <libconfig.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../config/config.h"

/* One valid model on one line, so the line numbers of what follows it are
 * easy to count. */
/* A 128-character name: one more than MODEL_NAME_MAX - 1. */
#define S64 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define S128 S64 S64

#define M "models = ( { name = \"demo\"; path = \"m.st\"; layers = ( { op = \"relu\"; } ); } );\n"

/* Writes text to dir/name, or to a fresh mkstemp file in /tmp when name
 * is NULL, and stores the path in path; callers remove it afterwards. */
static void write_file(const char *dir, const char *name, const char *text, char *path,
                       size_t cap)
{
    FILE *f;
    if (name) {
        snprintf(path, cap, "%s/%s", dir, name);
        f = fopen(path, "w");
    } else {
        snprintf(path, cap, "%s/kinfer_cfg_XXXXXX", dir ? dir : "/tmp");
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        f = fdopen(fd, "w");
    }
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Loads text as a config file with the given --set arguments; path gets
 * the temporary file's name (already removed) for error checks. */
static struct kcfg *load_text(const char *text, const char *const *sets, size_t n_sets,
                              char *err, size_t err_size, char *path, size_t path_size)
{
    write_file(NULL, NULL, text, path, path_size);
    struct kcfg *c = cfg_load(path, sets, n_sets, err, err_size);
    unlink(path);
    return c;
}

/* Loads text that must be good; fails the test with the error otherwise. */
static struct kcfg *load_good(const char *text, const char *const *sets, size_t n_sets)
{
    char err[512], path[256];
    struct kcfg *c = load_text(text, sets, n_sets, err, sizeof(err), path, sizeof(path));
    if (!c) fail_msg("unexpected error: %s", err);
    return c;
}

/* ---- bad files: one table, one cmocka test per row ---------------------- */

struct bad_case {
    const char *name;
    const char *text;
    const char *set;  /* one --set argument, or NULL */
    int line;         /* >0: the error must start "FILE:line: " */
    const char *want; /* substring of the error */
};

static const struct bad_case bad_cases[] = {
    /* libconfig's own parse errors */
    {"parse_error", M "kafka = {\n  brokers = ;\n};\n", NULL, 3, "syntax error"},
    {"parse_duplicate", M "default_model = \"demo\";\ndefault_model = \"demo\";\n", NULL, 3,
     "duplicate setting name"},
    {"parse_unterminated_string", M "log = { level = \"info; };\n", NULL, 0, "syntax error"},
    /* the gpu section */
    {"gpu_precision_unknown", M "gpu = {\n  precision = \"fp8\";\n};\n", NULL, 3,
     "gpu.precision: 'fp8' is not one of auto, fp32, tf32, fp16, bf16"},
    {"gpu_graphs_not_bool", M "gpu = {\n  graphs = 1;\n};\n", NULL, 3,
     "gpu.graphs: expected true or false, got an integer"},
    {"gpu_graphs_set_word", M, "gpu.graphs=maybe", 0, "--set gpu.graphs=maybe: expected true or false"},
    {"gpu_devices_dup", M "gpu = {\n  devices = [ 0, 1, 0 ];\n};\n", NULL, 3,
     "gpu.devices: device 0 is listed twice"},
    {"gpu_devices_negative", M "gpu = {\n  devices = [ -1 ];\n};\n", NULL, 3,
     "gpu.devices[0]: -1 is out of range 0..1023"},
    {"gpu_devices_not_array", M "gpu = {\n  devices = 0;\n};\n", NULL, 3,
     "gpu.devices: expected an array of device indices"},
    {"gpu_devices_set", M, "gpu.devices=0,2000", 0, "--set gpu.devices=0,2000: gpu.devices[1]: 2000 is out of range 0..1023"},
    {"gpu_executors_zero", M "gpu = {\n  executors_per_device = 0;\n};\n", NULL, 3,
     "0 is out of range 1..16"},
    {"worker_backend_unknown", M "worker = {\n  backend = \"tpu\";\n};\n", NULL, 3,
     "worker.backend: 'tpu' is not one of auto, cpu, cuda"},
    /* unknown keys, everywhere */
    {"unknown_top_level", M "kafkaa = { };\n", NULL, 2, "unknown setting 'kafkaa'"},
    {"unknown_top_level_scalar", M "\nthreads = 4;\n", NULL, 3, "unknown setting 'threads'"},
    {"unknown_section_key", M "kafka = {\n  brokerz = \"x\";\n};\n", NULL, 3,
     "unknown setting 'kafka.brokerz'"},
    {"unknown_nested_group", M "kafka = {\n  sasl = { user = \"x\"; };\n};\n", NULL, 3,
     "unknown setting 'kafka.sasl'"},
    {"unknown_model_key",
     "models = ( {\n  name = \"a\"; path = \"p\";\n  weights = \"w\";\n"
     "  layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 3, "unknown setting 'models[0].weights'"},
    {"unknown_layer_key",
     "models = ( { name = \"a\"; path = \"p\"; layers = (\n  { op = \"relu\"; },\n"
     "  { op = \"layernorm\"; weight = \"w\"; epz = 1e-6; } ); } );\n",
     NULL, 3, "unknown setting 'models[0].layers[1].epz'"},
    /* shapes and types */
    {"section_not_group", M "redis = 5;\n", NULL, 2, "redis: expected a group { ... }, got an integer"},
    {"int_got_string", M "redis = {\n  port = \"6379\";\n};\n", NULL, 3,
     "redis.port: expected an integer, got a string"},
    {"int_got_float", M "batching = { max_wait_ms = 5.0; };\n", NULL, 2,
     "batching.max_wait_ms: expected an integer, got a float"},
    {"int_got_bool", M "worker = { blas_threads = true; };\n", NULL, 2,
     "worker.blas_threads: expected an integer, got a boolean"},
    {"string_got_int", M "kafka = { brokers = 9092; };\n", NULL, 2,
     "kafka.brokers: expected a string, got an integer"},
    {"string_got_list", M "default_model = ( \"demo\" );\n", NULL, 2,
     "default_model: expected a string, got a list"},
    /* bounds */
    {"range_low", M "batching = {\n  max_batch_rows = 0;\n};\n", NULL, 3,
     "batching.max_batch_rows: 0 is out of range 1..65536"},
    {"range_high", M "redis = { port = 70000; };\n", NULL, 2,
     "redis.port: 70000 is out of range 1..65535"},
    {"range_negative", M "kafka = { revoke_timeout_ms = -1; };\n", NULL, 2,
     "kafka.revoke_timeout_ms: -1 is out of range 0..600000"},
    {"range_int64_into_int", M "redis = { port = 5000000000L; };\n", NULL, 2,
     "redis.port: 5000000000 is out of range 1..65535"},
    {"range_int64_low", M "redis = { ttl_ms = 0L; };\n", NULL, 2,
     "redis.ttl_ms: 0 is out of range 1..3153600000000"},
    {"range_int64_high", M "redis = { ttl_ms = 3153600000001L; };\n", NULL, 2,
     "redis.ttl_ms: 3153600000001 is out of range"},
    {"string_empty", M "kafka = { group = \"\"; };\n", NULL, 2, "kafka.group: must not be empty"},
    {"string_too_long", M "default_model =\n  \"" S128 "\";\n", NULL, 2,
     "default_model: '" S128 "' must be 1..127 characters long"},
    /* kafka.topics */
    {"topics_empty", M "kafka = { topics = [ ]; };\n", NULL, 2,
     "kafka.topics: must name at least one topic"},
    {"topics_not_list", M "kafka = { topics = \"jobs\"; };\n", NULL, 2,
     "kafka.topics: expected a list of strings"},
    {"topics_not_string", M "kafka = { topics = ( \"a\",\n  5 ); };\n", NULL, 3,
     "kafka.topics[1]: expected a string, got an integer"},
    {"topics_empty_string", M "kafka = { topics = [ \"\" ]; };\n", NULL, 2,
     "kafka.topics[0]: must not be empty"},
    {"topics_duplicate", M "kafka = { topics = [ \"a\", \"a\" ]; };\n", NULL, 2,
     "kafka.topics: 'a' is listed twice"},
    {"reply_topic_consumed", M "kafka = { topics = [ \"a\", \"b\" ];\n  reply_topic = \"b\"; };\n",
     NULL, 3, "kafka.reply_topic: 'b' is also in kafka.topics"},
    {"dlq_topic_consumed", M "kafka = {\n  dlq_topic = \"jobs\"; };\n", NULL, 3,
     "kafka.dlq_topic: 'jobs' is also in kafka.topics"},
    /* kafka.properties shape */
    {"properties_not_list", M "kafka = { properties = \"acks=all\"; };\n", NULL, 2,
     "kafka.properties: expected a list of pairs"},
    {"properties_group", M "kafka = { properties = { acks = \"all\"; }; };\n", NULL, 2,
     "kafka.properties: expected a list of pairs"},
    {"properties_flat_list", M "kafka = { properties = ( \"acks\", \"all\" ); };\n", NULL, 2,
     "kafka.properties[0]: expected a pair of strings"},
    {"properties_one_string", M "kafka = { properties = ( ( \"a\", \"b\" ),\n  ( \"c\" ) ); };\n",
     NULL, 3, "kafka.properties[1]: expected a pair of strings"},
    {"properties_three_strings", M "kafka = { properties = ( ( \"a\", \"b\", \"c\" ) ); };\n", NULL,
     2, "kafka.properties[0]: expected a pair of strings"},
    {"properties_number_value", M "kafka = { properties = ( ( \"linger.ms\", 5 ) ); };\n", NULL, 2,
     "write numbers as strings too"},
    {"properties_empty_name", M "kafka = { properties = ( ( \"\", \"x\" ) ); };\n", NULL, 2,
     "kafka.properties[0]: empty property name"},
    {"properties_duplicate",
     M "kafka = { properties = ( ( \"linger.ms\", \"5\" ),\n  ( \"linger.ms\", \"6\" ) ); };\n", NULL,
     3, "kafka.properties: 'linger.ms' is given twice"},
    /* kafka.properties kinfer depends on */
    {"unsafe_auto_offset_store", M "kafka = { properties = ( ( \"enable.auto.offset.store\", \"true\" ) ); };\n",
     NULL, 2, "'enable.auto.offset.store' must stay false: kinfer stores each offset itself"},
    {"unsafe_auto_commit", M "kafka = { properties = ( ( \"enable.auto.commit\", \"false\" ) ); };\n",
     NULL, 2, "'enable.auto.commit' must stay true"},
    {"unsafe_auto_commit_alias", M "kafka = { properties = ( ( \"auto.commit.enable\", \"0\" ) ); };\n",
     NULL, 2, "'auto.commit.enable' must stay true"},
    {"unsafe_offset_store_method", M "kafka = { properties = ( ( \"offset.store.method\", \"file\" ) ); };\n",
     NULL, 2, "'offset.store.method' must be broker"},
    {"unsafe_offset_reset", M "kafka = { properties = ( ( \"auto.offset.reset\", \"latest\" ) ); };\n",
     NULL, 2, "'auto.offset.reset' must be earliest: a new consumer group must not skip jobs"},
    {"unsafe_idempotence", M "kafka = { properties = ( ( \"enable.idempotence\", \"false\" ) ); };\n",
     NULL, 2, "'enable.idempotence' must stay true"},
    {"unsafe_acks", M "kafka = { properties = ( ( \"acks\", \"1\" ) ); };\n", NULL, 2,
     "'acks' must be all (or -1)"},
    {"unsafe_required_acks", M "kafka = { properties = ( ( \"request.required.acks\", \"0\" ) ); };\n",
     NULL, 2, "'request.required.acks' must be all (or -1)"},
    {"unsafe_transactional_id", M "kafka = { properties = ( ( \"transactional.id\", \"t\" ) ); };\n",
     NULL, 2, "'transactional.id' cannot be set"},
    {"unsafe_group_id", M "kafka = { properties = ( ( \"group.id\", \"kinfer\" ) ); };\n", NULL, 2,
     "'group.id' cannot be set here: use kafka.group"},
    {"unsafe_bootstrap", M "kafka = { properties = ( ( \"bootstrap.servers\", \"b:9092\" ) ); };\n",
     NULL, 2, "'bootstrap.servers' cannot be set here: use kafka.brokers"},
    {"unsafe_broker_list", M "kafka = { properties = ( ( \"metadata.broker.list\", \"b:9092\" ) ); };\n",
     NULL, 2, "'metadata.broker.list' cannot be set here: use kafka.brokers"},
    /* models */
    {"no_models", "log = { level = \"info\"; };\n", NULL, 0, "no models"},
    {"models_empty", "\nmodels = ( );\n", NULL, 2, "models: must list at least one model"},
    {"models_group", "models = { name = \"a\"; };\n", NULL, 1, "models: expected a list of groups"},
    {"model_not_group", "models = ( \"a\" );\n", NULL, 1, "models[0]: expected a group"},
    {"model_missing_name", "models = ( { path = \"p\";\n  layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0]: missing 'name'"},
    {"model_missing_path", "models = ( { name = \"a\";\n  layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0]: missing 'path'"},
    {"unknown_top_level_models2", M "models2 = 1;\n", NULL, 2, "unknown setting 'models2'"},
    {"model_folder_width", "models = ( { name = \"a\"; path = \"p\";\n  input_width = 4; } );\n",
     NULL, 2, "models[0].input_width: a model folder (an entry without layers) takes text"},
    {"model_encoder_with_layers", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"relu\"; } );\n"
     "  encoder = { pooling = \"mean\"; }; } );\n", NULL, 2,
     "models[0].encoder: only for a model folder, an entry without layers"},
    {"encoder_not_group", "models = ( { name = \"a\"; path = \"p\";\n  encoder = 5; } );\n", NULL, 2,
     "models[0].encoder: expected a group"},
    {"encoder_bad_pooling", "models = ( { name = \"a\"; path = \"p\"; encoder = {\n  pooling = \"avg\"; }; } );\n",
     NULL, 2, "models[0].encoder.pooling: 'avg' is not one of cls, mean, max, none"},
    {"encoder_bad_head", "models = ( { name = \"a\"; path = \"p\"; encoder = {\n  head = \"regressor\"; }; } );\n",
     NULL, 2, "models[0].encoder.head: 'regressor' is not one of embedding, classifier"},
    {"encoder_bad_activation", "models = ( { name = \"a\"; path = \"p\"; encoder = {\n  activation = \"relu\"; }; } );\n",
     NULL, 2, "models[0].encoder.activation: 'relu' is not one of softmax, sigmoid, none"},
    {"encoder_normalize_type", "models = ( { name = \"a\"; path = \"p\"; encoder = {\n  normalize = 1; }; } );\n",
     NULL, 2, "models[0].encoder.normalize: expected true or false, got an integer"},
    {"encoder_max_tokens_range", "models = ( { name = \"a\"; path = \"p\"; encoder = {\n  max_tokens = 2; }; } );\n",
     NULL, 2, "models[0].encoder.max_tokens: expected an integer in 3..65536"},
    {"encoder_unknown_key", "models = ( { name = \"a\"; path = \"p\"; encoder = {\n  poolin = \"cls\"; }; } );\n",
     NULL, 2, "unknown setting 'models[0].encoder.poolin'"},
    {"model_empty_name", "models = ( { name = \"\"; path = \"p\"; layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0].name: must not be empty"},
    {"model_empty_path", "models = ( { name = \"a\"; path = \"\"; layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0].path: must not be empty"},
    {"model_name_not_string", "models = ( { name = 5; path = \"p\"; layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0].name: expected a string, got an integer"},
    {"model_name_too_long",
     "models = ( { name = \"" S128 "\"; path = \"p\";"
     " layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "is longer than 127 characters"},
    {"model_name_chars", "models = ( { name = \"my model\"; path = \"p\"; layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0].name: 'my model' may hold only"},
    {"model_duplicate",
     "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"relu\"; } ); },\n"
     "  { name = \"a\"; path = \"q\"; layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 2, "models[1].name: model 'a' is defined twice"},
    {"model_width_negative",
     "models = ( { name = \"a\"; path = \"p\"; input_width = -1; layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0].input_width: -1 is out of range 0..16777216"},
    {"model_width_string",
     "models = ( { name = \"a\"; path = \"p\"; input_width = \"8\"; layers = ( { op = \"relu\"; } ); } );\n",
     NULL, 1, "models[0].input_width: expected an integer, got a string"},
    {"layers_empty", "models = ( { name = \"a\"; path = \"p\";\n  layers = ( ); } );\n", NULL, 2,
     "models[0].layers: must list at least one layer"},
    {"layers_not_list", "models = ( { name = \"a\"; path = \"p\"; layers = \"relu\"; } );\n", NULL, 1,
     "models[0].layers: expected a list of groups"},
    {"layer_not_group", "models = ( { name = \"a\"; path = \"p\"; layers = ( \"relu\" ); } );\n", NULL,
     1, "models[0].layers[0]: expected a group"},
    {"layer_missing_op", "models = ( { name = \"a\"; path = \"p\"; layers = (\n  { weight = \"w\"; } ); } );\n",
     NULL, 2, "models[0].layers[0]: missing 'op'"},
    {"layer_op_not_string", "models = ( { name = \"a\"; path = \"p\"; layers = (\n  { op = 1; } ); } );\n",
     NULL, 2, "models[0].layers[0].op: expected a string, got an integer"},
    {"layer_unknown_op", "models = ( { name = \"a\"; path = \"p\"; layers = (\n  { op = \"relu\"; },\n  { op = \"conv\"; } ); } );\n",
     NULL, 3, "models[0].layers[1].op: unknown op 'conv' (known: dense, relu,"},
    {"dense_needs_weight", "models = ( { name = \"a\"; path = \"p\"; layers = (\n  { op = \"dense\"; bias = \"b\"; } ); } );\n",
     NULL, 2, "models[0].layers[0]: op dense needs 'weight'"},
    {"weight_on_gelu", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"gelu\"; weight = \"w\"; } ); } );\n",
     NULL, 1, "'weight' does not apply to op gelu"},
    {"weight_on_relu", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"relu\";\n  weight = \"w\"; } ); } );\n",
     NULL, 2, "models[0].layers[0]: 'weight' does not apply to op relu"},
    {"bias_on_softmax", "models = ( { name = \"a\"; path = \"p\"; layers = ( { bias = \"b\"; op = \"softmax\"; } ); } );\n",
     NULL, 1, "'bias' does not apply to op softmax"},
    {"eps_on_dense", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"dense\"; weight = \"w\";\n  eps = 1e-5; } ); } );\n",
     NULL, 2, "models[0].layers[0]: 'eps' does not apply to op dense"},
    {"eps_zero", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"layernorm\"; weight = \"w\"; eps = 0.0; } ); } );\n",
     NULL, 1, "models[0].layers[0].eps: 0 is out of range"},
    {"eps_string", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"layernorm\"; weight = \"w\"; eps = \"1e-5\"; } ); } );\n",
     NULL, 1, "models[0].layers[0].eps: expected a number, got a string"},
    {"weight_empty", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"dense\"; weight = \"\"; } ); } );\n",
     NULL, 1, "models[0].layers[0].weight: must not be empty"},
    {"bias_not_string", "models = ( { name = \"a\"; path = \"p\"; layers = ( { op = \"dense\"; weight = \"w\"; bias = 0; } ); } );\n",
     NULL, 1, "models[0].layers[0].bias: expected a string, got an integer"},
    /* default_model */
    {"default_model_missing", M "\ndefault_model = \"other\";\n", NULL, 3,
     "default_model: 'other' is not one of the models"},
    {"default_model_empty", M "default_model = \"\";\n", NULL, 2, "default_model: must not be empty"},
    /* log */
    {"log_level_bad", M "log = {\n  level = \"verbose\";\n};\n", NULL, 3,
     "log.level: 'verbose' is not one of error, warn, info, debug"},
    {"log_format_bad", M "log = { format = \"xml\"; };\n", NULL, 2,
     "log.format: 'xml' is not one of text, json"},
    /* metrics.listen */
    {"listen_no_port", M "metrics = { listen = \"localhost\"; };\n", NULL, 2,
     "metrics.listen: 'localhost' is not host:port"},
    {"listen_no_host", M "metrics = { listen = \":9464\"; };\n", NULL, 2, "is not host:port"},
    {"listen_empty_port", M "metrics = { listen = \"localhost:\"; };\n", NULL, 2,
     "the port must be a number in 0..65535"},
    {"listen_port_high", M "metrics = { listen = \"localhost:65536\"; };\n", NULL, 2,
     "the port must be a number in 0..65535"},
    {"listen_port_minus", M "metrics = { listen = \"localhost:-1\"; };\n", NULL, 2,
     "the port must be a number in 0..65535"},
    {"listen_port_alpha", M "metrics = { listen = \"localhost:http\"; };\n", NULL, 2,
     "the port must be a number in 0..65535"},
    {"listen_ipv6_bare", M "metrics = { listen = \"::1:9464\"; };\n", NULL, 2,
     "write an IPv6 host in brackets"},
    {"listen_ipv6_unclosed", M "metrics = { listen = \"[::1:9464\"; };\n", NULL, 2,
     "an IPv6 host must be [addr]:port"},
    /* cross-field */
    {"queued_below_batch", M "batching = {\n  max_batch_rows = 64;\n  max_queued_rows = 32;\n};\n",
     NULL, 4, "batching.max_queued_rows: max_queued_rows (32) must be >= max_batch_rows (64)"},
    {"queued_below_job", M "batching = {\n  max_job_rows = 8192;\n};\n", NULL, 3,
     "batching.max_job_rows: max_queued_rows (4096) must be >= 2 x max_job_rows (8192)"},
    {"queued_below_two_jobs", M "batching = {\n  max_job_rows = 2049;\n};\n", NULL, 3,
     "batching.max_job_rows: max_queued_rows (4096) must be >= 2 x max_job_rows (2049): the "
     "queue must hold two of the largest jobs, or it fills and stops fetching after every job; "
     "lower max_job_rows to 2048 or raise max_queued_rows to 4098"},
    {"queued_one_job", M "batching = {\n  max_queued_rows = 128;\n  max_job_rows = 128;\n};\n",
     NULL, 3, "batching.max_queued_rows: max_queued_rows (128) must be >= 2 x max_job_rows (128)"},
    {"batch_above_default_queue", M "batching = {\n  max_batch_rows = 5000; max_job_rows = 16;\n};\n",
     NULL, 3, "batching.max_batch_rows: max_queued_rows (4096) must be >= max_batch_rows (5000)"},
    /* --set */
    {"set_bad_int", M, "batching.max_wait_ms=abc", 0, "--set batching.max_wait_ms=abc: expected an integer"},
    {"set_empty_int", M, "batching.max_wait_ms=", 0, "--set batching.max_wait_ms=: expected an integer"},
    {"set_trailing_junk", M, "batching.max_wait_ms=5ms", 0, "expected an integer"},
    {"set_huge_int", M, "redis.ttl_ms=99999999999999999999", 0, "expected an integer"},
    {"set_range", M, "batching.max_batch_rows=0", 0,
     "--set batching.max_batch_rows=0: 0 is out of range 1..65536"},
    {"set_unknown", M, "kafka.nope=1", 0, "--set kafka.nope=1: unknown setting"},
    {"set_unknown_top", M, "nope=1", 0, "--set nope=1: unknown setting"},
    {"set_section", M, "kafka=1", 0, "--set kafka=1: unknown setting"},
    {"set_no_equals", M, "batching.max_wait_ms", 0, "--set batching.max_wait_ms: expected section.key=value"},
    {"set_no_name", M, "=5", 0, "expected section.key=value"},
    {"set_list_empty_item", M, "kafka.topics=a,,b", 0,
     "--set kafka.topics=a,,b: kafka.topics[1]: must not be empty"},
    {"set_list_twice", M, "kafka.topics=a, a", 0, "--set kafka.topics=a, a: kafka.topics: 'a' is listed twice"},
    {"set_list_not_ints", M, "batching.preferred_sizes=8,x", 0,
     "--set batching.preferred_sizes=8,x: expected an array of integers [ 8, 16, 32 ]"},
    {"set_models", M, "models=x", 0, "--set models=x: expected a list of groups"},
    {"set_bad_choice", M, "log.level=loud", 0, "--set log.level=loud: 'loud' is not one of"},
    {"set_empty_string", M, "kafka.brokers=", 0, "--set kafka.brokers=: must not be empty"},
    {"set_bad_listen", M, "metrics.listen=9464", 0, "--set metrics.listen=9464: '9464' is not host:port"},
    {"set_default_model_unknown", M, "default_model=nope", 0,
     "--set default_model=nope: 'nope' is not one of the models"},
    {"set_cross_field", M, "batching.max_queued_rows=16", 0,
     "--set batching.max_queued_rows=16: max_queued_rows (16) must be >= max_batch_rows (32)"},
    {"set_reply_topic_consumed", M, "kafka.reply_topic=jobs", 0,
     "--set kafka.reply_topic=jobs: 'jobs' is also in kafka.topics"},
    {"set_unsafe_property", M, "kafka.properties.enable.auto.commit=false", 0,
     "--set kafka.properties.enable.auto.commit=false: 'enable.auto.commit' must stay true"},
    {"set_property_no_name", M, "kafka.properties.=x", 0, "empty property name"},
};
#define N_BAD (sizeof(bad_cases) / sizeof(bad_cases[0]))

/* Runs one bad_cases row: the load must fail, name the file and line when
 * the row says so, and contain the expected words. */
static void test_bad(void **state)
{
    const struct bad_case *bc = *state;
    char err[1024], path[256];
    const char *sets[1] = {bc->set};
    struct kcfg *c = load_text(bc->text, sets, bc->set ? 1 : 0, err, sizeof(err), path, sizeof(path));
    if (c) {
        cfg_destroy(c);
        fail_msg("%s: loaded, expected an error containing \"%s\"", bc->name, bc->want);
    }
    if (!strstr(err, bc->want)) fail_msg("%s: error \"%s\" lacks \"%s\"", bc->name, err, bc->want);
    if (bc->line > 0) {
        char prefix[300];
        snprintf(prefix, sizeof(prefix), "%s:%d: ", path, bc->line);
        if (strncmp(err, prefix, strlen(prefix)) != 0)
            fail_msg("%s: error \"%s\" does not start with \"%s\"", bc->name, err, prefix);
    } else if (!bc->set && !strstr(err, path)) {
        fail_msg("%s: error \"%s\" does not name the file", bc->name, err);
    }
}

/* ---- good files --------------------------------------------------------- */

/* A missing file is an error naming the file and the reason. */
static void test_missing_file(void **state)
{
    (void)state;
    char err[512];
    assert_null(cfg_load("/nonexistent/kinfer.cfg", NULL, 0, err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/kinfer.cfg: No such file or directory"));
    assert_null(cfg_load("/tmp", NULL, 0, err, sizeof(err)));
    assert_string_equal(err, "/tmp: is a directory");
    assert_null(cfg_load(NULL, NULL, 0, err, sizeof(err)));
    assert_non_null(strstr(err, "no config file"));
}

/* The table itself is sane: names unique, int bounds fit an int, defaults
 * inside their own bounds and choices. A bad row would otherwise only
 * show when someone sets that key. */
static void test_table_sane(void **state)
{
    (void)state;
    size_t n;
    const struct cfgtab_row *o = cfg_options(&n);
    assert_true(n > 20);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) assert_string_not_equal(o[i].name, o[j].name);
        assert_true(o[i].min <= o[i].max);
        assert_non_null(o[i].doc);
        if (o[i].type == CFGTAB_INT) {
            assert_true(o[i].min >= INT_MIN && o[i].max <= INT_MAX);
        }
        if (o[i].type == CFGTAB_BOOL) assert_true(o[i].min == 0 && o[i].max == 1);
        if (o[i].type != CFGTAB_STRING) {
            assert_true(o[i].def_int >= o[i].min && o[i].def_int <= o[i].max);
        } else if (o[i].def_str) {
            long long len = (long long)strlen(o[i].def_str);
            assert_true(len >= o[i].min && len <= o[i].max);
            if (o[i].choices) {
                const char *const *ch = o[i].choices;
                while (*ch && strcmp(*ch, o[i].def_str) != 0) ch++;
                assert_non_null(*ch);
            }
            if (o[i].check) {
                char why[128];
                assert_int_equal(o[i].check(o[i].def_str, why, sizeof(why)), 0);
            }
        }
    }
}

/* Reads row o's value out of c, as text, so rows of any type compare. */
static void option_value(const struct kcfg *c, const struct cfgtab_row *o, char *buf, size_t cap)
{
    const char *base = (const char *)c + o->offset;
    if (o->type == CFGTAB_INT || o->type == CFGTAB_BOOL) snprintf(buf, cap, "%d", *(const int *)base);
    else if (o->type == CFGTAB_INT64) snprintf(buf, cap, "%lld", (long long)*(const int64_t *)base);
    else snprintf(buf, cap, "%s", *(char *const *)base ? *(char *const *)base : "(null)");
}

/* The table's default of row o as text (NULL: computed). */
static const char *option_default(const struct cfgtab_row *o, char *buf, size_t cap)
{
    if (o->type == CFGTAB_STRING) return o->def_str;
    snprintf(buf, cap, "%lld", o->def_int);
    return buf;
}

/* Absent sections and keys keep the table's defaults; the computed ones
 * (topics, default_model, eps) get theirs. */
static void test_defaults(void **state)
{
    (void)state;
    struct kcfg *c = load_good("# only a model\n" M, NULL, 0);
    size_t n;
    const struct cfgtab_row *o = cfg_options(&n);
    for (size_t i = 0; i < n; i++) {
        char got[256], def[64];
        const char *want = option_default(&o[i], def, sizeof(def));
        option_value(c, &o[i], got, sizeof(got));
        if (want) assert_string_equal(got, want);
    }
    assert_string_equal(c->kafka.brokers, "127.0.0.1:9092");
    assert_int_equal(c->batching.max_batch_rows, 32);
    assert_int_equal(c->redis.ttl_ms, 3600000);
    assert_int_equal(c->kafka.n_topics, 1);
    assert_string_equal(c->kafka.topics[0], "jobs");
    assert_int_equal(c->kafka.n_properties, 0);
    assert_string_equal(c->default_model, "demo");
    assert_int_equal(c->n_models, 1);
    assert_int_equal(c->models[0].n_layers, 1);
    assert_int_equal(c->models[0].layers[0].op, MODEL_OP_RELU);
    assert_string_equal(c->models[0].layers[0].weight, "");
    assert_string_equal(c->models[0].layers[0].bias, "");
    assert_int_equal(c->models[0].input_width, 0);
    /* gpu.precision "auto": resolved from these models' weights when the
     * runtime opens, so the runtime's settings carry the flag and them */
    assert_string_equal(c->gpu.precision, "auto");
    struct model_runtime_conf rc;
    cfg_model_runtime(c, &rc);
    assert_int_equal(rc.precision_auto, 1);
    assert_ptr_equal(rc.specs, c->models);
    assert_int_equal(rc.n_specs, 1);
    cfg_destroy(c);
}

/* "auto" is accepted written out too, and wins over the file by --set;
 * an explicit precision clears the flag. */
static void test_precision_auto(void **state)
{
    (void)state;
    const char *sets[] = {"gpu.precision=auto"};
    struct kcfg *c = load_good("gpu = { precision = \"bf16\"; };\n" M, sets, 1);
    assert_string_equal(c->gpu.precision, "auto");
    struct model_runtime_conf rc;
    cfg_model_runtime(c, &rc);
    assert_int_equal(rc.precision_auto, 1);
    cfg_destroy(c);
    c = load_good("gpu = { precision = \"auto\"; };\n" M, NULL, 0);
    cfg_model_runtime(c, &rc);
    assert_int_equal(rc.precision_auto, 1);
    cfg_destroy(c);
    const char *fp16[] = {"gpu.precision=fp16"};
    c = load_good("gpu = { precision = \"auto\"; };\n" M, fp16, 1);
    cfg_model_runtime(c, &rc);
    assert_int_equal(rc.precision_auto, 0);
    assert_int_equal(rc.precision, MODEL_FP16);
    cfg_destroy(c);
}

static const char full_cfg[] =
    "kafka = { brokers = \"k1:9092,k2:9092\"; group = \"g\"; topics = ( \"a\", \"b\" );\n"
    "  reply_topic = \"r\"; dlq_topic = \"d\"; revoke_timeout_ms = 500;\n"
    "  properties = ( ( \"security.protocol\", \"plaintext\" ), [ \"linger.ms\", \"7\" ],\n"
    "    ( \"acks\", \"all\" ), ( \"enable.auto.commit\", \"true\" ),\n"
    "    ( \"enable.auto.offset.store\", \"false\" ), ( \"auto.offset.reset\", \"earliest\" ),\n"
    "    ( \"enable.idempotence\", \"TRUE\" ), ( \"request.required.acks\", \"-1\" ),\n"
    "    ( \"enable.partition.eof\", \"true\" ) ); };\n"
    "redis = { host = \"r.local\"; port = 6380L; password = \"pw\"; db = 3;\n"
    "  key_prefix = \"p:\"; ttl_ms = 3600000000L; timeout_ms = 150; publish_channel = \"ch\"; };\n"
    "batching = { max_batch_rows = 64; max_wait_ms = 0; max_job_rows = 128; max_queued_rows = 256; };\n"
    "models = (\n"
    "  { name = \"mlp\"; path = \"/abs/mlp.safetensors\"; input_width = 16;\n"
    "    layers = ( { op = \"dense\"; weight = \"0.weight\"; bias = \"0.bias\"; },\n"
    "               { op = \"gelu\"; }, { op = \"tanh\"; }, { op = \"sigmoid\"; },\n"
    "               { op = \"layernorm\"; weight = \"ln.w\"; bias = \"ln.b\"; eps = 1e-6; },\n"
    "               { op = \"layernorm\"; },\n"
    "               { op = \"dense\"; weight = \"1.weight\"; },\n"
    "               { op = \"softmax\"; }, { op = \"l2norm\"; } ); },\n"
    "  { name = \"enc-v2.1:small/x_y\"; path = \"/abs/b.safetensors\"; input_width = 4L;\n"
    "    layers = ( { op = \"relu\"; } ); }\n"
    ");\n"
    "default_model = \"enc-v2.1:small/x_y\";\n"
    "metrics = { listen = \"[::1]:9100\"; };\n"
    "worker = { drain_timeout_ms = 1000; max_payload_bytes = 4096; blas_threads = 2; };\n"
    "log = { level = \"debug\"; format = \"json\"; };\n"
    "gpu = { precision = \"bf16\"; graphs = false; devices = [ 1, 0 ];\n"
    "  executors_per_device = 3; workspace_mb = 64; };\n";

/* Every value in a full file lands in its field; int and int64 literals
 * are taken for either kind of field; guarded properties given their safe
 * values pass through. */
static void test_all_values(void **state)
{
    (void)state;
    struct kcfg *c = load_good(full_cfg, NULL, 0);
    assert_string_equal(c->kafka.brokers, "k1:9092,k2:9092");
    assert_string_equal(c->kafka.group, "g");
    assert_int_equal(c->kafka.n_topics, 2);
    assert_string_equal(c->kafka.topics[0], "a");
    assert_string_equal(c->kafka.topics[1], "b");
    assert_string_equal(c->kafka.reply_topic, "r");
    assert_string_equal(c->kafka.dlq_topic, "d");
    assert_int_equal(c->kafka.revoke_timeout_ms, 500);
    assert_int_equal(c->kafka.n_properties, 9);
    assert_string_equal(c->kafka.properties[0].key, "security.protocol");
    assert_string_equal(c->kafka.properties[0].value, "plaintext");
    assert_string_equal(c->kafka.properties[1].key, "linger.ms");
    assert_string_equal(c->kafka.properties[1].value, "7");
    assert_string_equal(c->kafka.properties[8].key, "enable.partition.eof");
    assert_string_equal(c->redis.host, "r.local");
    assert_int_equal(c->redis.port, 6380);
    assert_string_equal(c->redis.password, "pw");
    assert_int_equal(c->redis.db, 3);
    assert_string_equal(c->redis.key_prefix, "p:");
    assert_true(c->redis.ttl_ms == 3600000000LL);
    assert_int_equal(c->redis.timeout_ms, 150);
    assert_string_equal(c->redis.publish_channel, "ch");
    assert_int_equal(c->batching.max_batch_rows, 64);
    assert_int_equal(c->batching.max_wait_ms, 0);
    assert_int_equal(c->batching.max_job_rows, 128);
    assert_int_equal(c->batching.max_queued_rows, 256);
    assert_int_equal(c->n_models, 2);
    const struct model_spec *m = &c->models[0];
    assert_string_equal(m->name, "mlp");
    assert_string_equal(m->path, "/abs/mlp.safetensors");
    assert_int_equal(m->input_width, 16);
    assert_int_equal(m->n_layers, 9);
    assert_int_equal(m->layers[0].op, MODEL_OP_DENSE);
    assert_string_equal(m->layers[0].weight, "0.weight");
    assert_string_equal(m->layers[0].bias, "0.bias");
    assert_int_equal(m->layers[1].op, MODEL_OP_GELU);
    assert_int_equal(m->layers[2].op, MODEL_OP_TANH);
    assert_int_equal(m->layers[3].op, MODEL_OP_SIGMOID);
    assert_int_equal(m->layers[4].op, MODEL_OP_LAYERNORM);
    assert_string_equal(m->layers[4].weight, "ln.w");
    assert_string_equal(m->layers[4].bias, "ln.b");
    assert_true(m->layers[4].eps == 1e-6);
    assert_true(m->layers[5].eps == 1e-5);
    assert_string_equal(m->layers[5].weight, "");
    assert_string_equal(m->layers[5].bias, "");
    assert_string_equal(m->layers[6].weight, "1.weight");
    assert_string_equal(m->layers[6].bias, "");
    assert_int_equal(m->layers[7].op, MODEL_OP_SOFTMAX);
    assert_int_equal(m->layers[8].op, MODEL_OP_L2NORM);
    assert_string_equal(c->models[1].name, "enc-v2.1:small/x_y");
    assert_int_equal(c->models[1].input_width, 4);
    assert_string_equal(c->default_model, "enc-v2.1:small/x_y");
    assert_string_equal(c->metrics.listen, "[::1]:9100");
    assert_int_equal(c->worker.drain_timeout_ms, 1000);
    assert_int_equal(c->worker.max_payload_bytes, 4096);
    assert_int_equal(c->worker.blas_threads, 2);
    assert_string_equal(c->gpu.precision, "bf16");
    assert_int_equal(c->gpu.graphs, 0);
    assert_int_equal(c->gpu.n_devices, 2);
    assert_int_equal(c->gpu.devices[0], 1);
    assert_int_equal(c->gpu.devices[1], 0);
    assert_int_equal(c->gpu.executors_per_device, 3);
    assert_int_equal(c->gpu.workspace_mb, 64);
    /* ... and reach the model runtime's settings as they are. */
    struct model_runtime_conf rc;
    cfg_model_runtime(c, &rc);
    assert_int_equal(rc.precision, MODEL_BF16);
    assert_int_equal(rc.precision_auto, 0);
    assert_int_equal(rc.graphs, 0);
    assert_int_equal(rc.n_devices, 2);
    assert_int_equal(rc.devices[0], 1);
    assert_int_equal(rc.executors_per_device, 3);
    assert_int_equal(rc.workspace_mb, 64);
    assert_int_equal(rc.cpu_threads, 2);
    assert_string_equal(c->log.level, "debug");
    assert_string_equal(c->log.format, "json");
    assert_int_equal(cfg_model_index(c, "mlp"), 0);
    assert_int_equal(cfg_model_index(c, "enc-v2.1:small/x_y"), 1);
    assert_int_equal(cfg_model_index(c, "nope"), -1);
    cfg_destroy(c);
}

/* --set wins over the file and the defaults, for every kind of row, top
 * level included; later --set wins over earlier; properties are added or
 * replaced. */
static void test_set_overrides(void **state)
{
    (void)state;
    const char *sets[] = {
        "batching.max_wait_ms=9",
        "redis.ttl_ms=5000000000",
        "kafka.brokers=b1:9092",
        "redis.password=",
        "default_model=second",
        "log.level=warn",
        "log.level=error",
        "metrics.listen=0.0.0.0:9000",
        "kafka.properties.linger.ms=20",
        "kafka.properties.compression.type=lz4",
        "kafka.properties.acks=all",
        "batching.max_batch_rows=+48",
        "gpu.graphs=false",
        "gpu.precision=fp16",
        "kafka.topics=in.a, in.b,in.\"c",
        "batching.preferred_sizes=[ 4, 8 ]",
        "batching.topic_priorities=( ( \"in.a\", 2 ) )",
    };
    struct kcfg *c = load_good(
        "redis = { password = \"secret\"; };\n"
        "batching = { max_wait_ms = 3; };\n"
        "kafka = { properties = ( ( \"linger.ms\", \"5\" ) ); };\n"
        "models = ( { name = \"first\"; path = \"a\"; layers = ( { op = \"relu\"; } ); },\n"
        "           { name = \"second\"; path = \"b\"; layers = ( { op = \"relu\"; } ); } );\n",
        sets, sizeof(sets) / sizeof(sets[0]));
    assert_int_equal(c->batching.max_wait_ms, 9);
    assert_true(c->redis.ttl_ms == 5000000000LL);
    assert_string_equal(c->kafka.brokers, "b1:9092");
    assert_string_equal(c->redis.password, "");
    assert_string_equal(c->default_model, "second");
    assert_string_equal(c->log.level, "error");
    assert_string_equal(c->metrics.listen, "0.0.0.0:9000");
    assert_int_equal(c->batching.max_batch_rows, 48);
    assert_int_equal(c->gpu.graphs, 0);
    assert_string_equal(c->gpu.precision, "fp16");
    assert_int_equal(c->kafka.n_properties, 3);
    assert_string_equal(c->kafka.properties[0].key, "linger.ms");
    assert_string_equal(c->kafka.properties[0].value, "20");
    assert_string_equal(c->kafka.properties[1].key, "compression.type");
    assert_string_equal(c->kafka.properties[1].value, "lz4");
    assert_string_equal(c->kafka.properties[2].value, "all");
    /* lists by --set: a,b for strings, the file's syntax for any */
    assert_int_equal(c->kafka.n_topics, 3);
    assert_string_equal(c->kafka.topics[0], "in.a");
    assert_string_equal(c->kafka.topics[1], "in.b");
    assert_string_equal(c->kafka.topics[2], "in.\"c");
    assert_int_equal(c->batching.n_preferred_sizes, 2);
    assert_int_equal(c->batching.preferred_sizes[1], 8);
    assert_int_equal(cfg_topic_priority(c, "in.a"), 2);
    cfg_destroy(c);
}

/* metrics.listen with port 0: accepted; the worker binds a free port and
 * logs it (telemetry/metrics.c). */
static void test_listen_port_zero(void **state)
{
    (void)state;
    struct kcfg *c = load_good(M "metrics = { listen = \"127.0.0.1:0\"; };\n", NULL, 0);
    assert_string_equal(c->metrics.listen, "127.0.0.1:0");
    cfg_destroy(c);
}

/* A --set can also repair a file value that alone would fail the
 * cross-field check, since validation runs after every --set. */
static void test_set_before_validation(void **state)
{
    (void)state;
    const char *sets[] = {"batching.max_queued_rows=16384"};
    struct kcfg *c = load_good(M "batching = { max_job_rows = 8192; };\n", sets, 1);
    assert_int_equal(c->batching.max_queued_rows, 16384);
    cfg_destroy(c);
}

/* Relative model paths are resolved against the directory of the config
 * file; absolute ones are kept; a config named without a directory leaves
 * them relative to the cwd, which is that same directory. */
static void test_relative_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/kinfer_cfgdir_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[512], inc[512], err[512];
    write_file(dir, "models.cfg",
               "models = ( { name = \"demo\"; path = \"models/demo.safetensors\";\n"
               "  layers = ( { op = \"relu\"; } ); },\n"
               "  { name = \"abs\"; path = \"/srv/abs.safetensors\"; layers = ( { op = \"relu\"; } ); },\n"
               "  { name = \"up\"; path = \"../up.safetensors\"; layers = ( { op = \"relu\"; } ); } );\n",
               inc, sizeof(inc));
    write_file(dir, "x.cfg", "log = { level = \"info\"; };\n@include \"models.cfg\"\n", path,
               sizeof(path));
    struct kcfg *c = cfg_load(path, NULL, 0, err, sizeof(err));
    if (!c) fail_msg("%s", err);
    char want[600];
    snprintf(want, sizeof(want), "%s/models/demo.safetensors", dir);
    assert_string_equal(c->models[0].path, want);
    assert_string_equal(c->models[1].path, "/srv/abs.safetensors");
    snprintf(want, sizeof(want), "%s/../up.safetensors", dir);
    assert_string_equal(c->models[2].path, want);
    cfg_destroy(c);

    /* An error inside an included file names that file. */
    write_file(dir, "models.cfg", "models = ( { name = \"demo\";\n  path = 5; layers = ( ); } );\n",
               inc, sizeof(inc));
    assert_null(cfg_load(path, NULL, 0, err, sizeof(err)));
    char prefix[600];
    snprintf(prefix, sizeof(prefix), "%s:2: models[0].path: expected a string", inc);
    assert_non_null(strstr(err, prefix));

    unlink(inc);
    unlink(path);
    rmdir(dir);
}

/* Checks that every package of the Makefile variable name (its
 * continuation lines and $(OTHER) references followed) appears as a word
 * in para; counts them in *n. */
static void check_deb_pkgs(const char *make, const char *name, const char *para, int depth,
                           size_t *n)
{
    assert_true(depth < 4);
    char head[64];
    snprintf(head, sizeof(head), "\n%s := ", name);
    const char *p = strstr(make, head);
    if (!p) fail_msg("the Makefile has no %s", name);
    p += strlen(head);
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\\' && p[1] == '\n') {
            p += 2;
            continue;
        }
        if (*p == '\n' || !*p) break;
        size_t w = strcspn(p, " \t\\\n");
        if (w > 3 && p[0] == '$' && p[1] == '(' && p[w - 1] == ')') {
            char ref[64];
            snprintf(ref, sizeof(ref), "%.*s", (int)(w - 3), p + 2);
            check_deb_pkgs(make, ref, para, depth + 1, n);
        } else {
            char word[80];
            snprintf(word, sizeof(word), " %.*s ", (int)w, p);
            char padded[4096];
            snprintf(padded, sizeof(padded), " %s ", para);
            if (!strstr(padded, word)) fail_msg("README's `make deps` list lacks%s", word);
            ++*n;
        }
        p += w;
    }
}

/* The README's configuration table names every table row in its
 * section's line (`| `section` | ... `key` (default) ...`). */
static void test_readme_table(void **state)
{
    (void)state;
    FILE *f = fopen("README.md", "r");
    if (!f) fail_msg("README.md (run from the repo root) cannot be opened");
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof(text) - 1, f);
    text[len] = '\0';
    fclose(f);
    size_t n;
    const struct cfgtab_row *o = cfg_options(&n);
    for (size_t i = 0; i < n; i++) {
        const char *dot = strchr(o[i].name, '.');
        if (!dot) continue; /* default_model has a row of its own */
        char head[64], key[96];
        snprintf(head, sizeof(head), "\n| `%.*s` |", (int)(dot - o[i].name), o[i].name);
        snprintf(key, sizeof(key), "`%s`", dot + 1);
        const char *row = strstr(text, head);
        if (!row) fail_msg("README's settings table has no row for section %s", head + 2);
        const char *end = strchr(row + 1, '\n');
        size_t rlen = end ? (size_t)(end - row) : strlen(row);
        char *line = strndup(row, rlen);
        assert_non_null(line);
        if (!strstr(line, key)) fail_msg("README's settings table lacks %s", o[i].name);
        free(line);
    }
    /* and `make deps`'s list is the Makefile's DEB_PKGS, every package */
    FILE *mk = fopen("Makefile", "r");
    assert_non_null(mk);
    static char make[1 << 17];
    size_t mlen = fread(make, 1, sizeof(make) - 1, mk);
    make[mlen] = '\0';
    fclose(mk);
    const char *deps = strstr(text, "`make deps` installs");
    assert_non_null(deps);
    const char *deps_end = strstr(deps, "\n\n");
    assert_non_null(deps_end);
    char *para = strndup(deps, (size_t)(deps_end - deps));
    assert_non_null(para);
    for (char *q = para; *q; q++)
        if (strchr("\n`():;,", *q)) *q = ' ';
    size_t n_pk = 0;
    check_deb_pkgs(make, "DEB_PKGS", para, 0, &n_pk);
    assert_true(n_pk >= 10);
    free(para);
}

/* A small bounded buffer still yields a terminated, truncated message. */
static void test_small_errstr(void **state)
{
    (void)state;
    char err[16], path[256];
    memset(err, 'x', sizeof(err));
    assert_null(load_text(M "kafka = { brokerz = 1; };\n", NULL, 0, err, sizeof(err), path,
                          sizeof(path)));
    assert_true(memchr(err, '\0', sizeof(err)) != NULL);
}

/* worker.cfg, the user-facing reference, loads, and shows every table row
 * with the table's default, so the docs cannot drift from the code. The
 * lists are there too. */
static void test_worker_cfg(void **state)
{
    (void)state;
    char err[512];
    struct kcfg *c = cfg_load("worker.cfg", NULL, 0, err, sizeof(err));
    if (!c) fail_msg("worker.cfg (run from the repo root): %s", err);

    config_t lc;
    config_init(&lc);
    assert_int_equal(config_read_file(&lc, "worker.cfg"), CONFIG_TRUE);
    size_t n;
    const struct cfgtab_row *o = cfg_options(&n);
    for (size_t i = 0; i < n; i++) {
        if (!config_lookup(&lc, o[i].name)) fail_msg("worker.cfg lacks %s", o[i].name);
        char got[256], def[64];
        const char *want = option_default(&o[i], def, sizeof(def));
        option_value(c, &o[i], got, sizeof(got));
        if (!want) want = c->models[0].name; /* default_model: the first model */
        if (strcmp(got, want) != 0)
            fail_msg("worker.cfg: %s = %s, but its default is %s", o[i].name, got, want);
    }
    const char *lists[] = {"kafka.topics", "kafka.properties", "models"};
    for (size_t i = 0; i < 3; i++)
        if (!config_lookup(&lc, lists[i])) fail_msg("worker.cfg lacks %s", lists[i]);
    config_destroy(&lc);

    assert_int_equal(c->kafka.n_topics, 1);
    assert_string_equal(c->kafka.topics[0], "jobs");
    assert_int_equal(c->kafka.n_properties, 0);
    assert_int_equal(c->n_models, 4);
    const struct model_spec *m = &c->models[0];
    assert_string_equal(m->name, "demo");
    assert_string_equal(m->path, "models/demo.safetensors");
    assert_int_equal(m->n_layers, 3);
    assert_int_equal(m->layers[0].op, MODEL_OP_DENSE);
    assert_string_equal(m->layers[0].weight, "0.weight");
    assert_string_equal(m->layers[0].bias, "0.bias");
    assert_int_equal(m->layers[1].op, MODEL_OP_RELU);
    assert_int_equal(m->layers[2].op, MODEL_OP_DENSE);
    assert_string_equal(m->layers[2].weight, "2.weight");
    assert_string_equal(m->layers[2].bias, "2.bias");
    /* The text encoder make demo writes: a folder, the folder's settings. */
    const struct model_spec *t = &c->models[1];
    assert_string_equal(t->name, "text-demo");
    assert_string_equal(t->path, "models/text-demo");
    assert_int_equal(t->n_layers, 0);
    assert_int_equal(t->enc.pooling, -1);
    assert_int_equal(t->enc.normalize, -1);
    assert_int_equal(t->enc.max_tokens, 0);
    assert_string_equal(c->models[2].name, "roberta-demo");
    assert_string_equal(c->models[2].path, "models/roberta-demo");
    assert_int_equal(c->models[2].n_layers, 0);
    /* The generating demo (`kinfer model demo --kind llama`): a folder too. */
    assert_string_equal(c->models[3].name, "llama-demo");
    assert_string_equal(c->models[3].path, "models/llama-demo");
    assert_int_equal(c->models[3].n_layers, 0);
    cfg_destroy(c);
}

/* The config reader judges a layer's keys by gpu/model.h's op table: for
 * every op, each key the table gives it is accepted, each other key is
 * refused, and a layer that leaves out a required key is refused. */
static void test_layer_keys_follow_op_table(void **state)
{
    (void)state;
    static const struct {
        unsigned key;
        const char *text;
    } keys[] = {{MODEL_KEY_WEIGHT, "weight = \"w\"; "},
                {MODEL_KEY_BIAS, "bias = \"b\"; "},
                {MODEL_KEY_EPS, "eps = 0.001; "}};
    for (int op = 0; op < MODEL_N_OPS; op++) {
        const struct model_op_desc *d = model_op_desc((enum model_op)op);
        assert_non_null(d);
        char required[128] = "";
        for (size_t k = 0; k < 3; k++)
            if (d->required & keys[k].key) strcat(required, keys[k].text);
        for (size_t k = 0; k < 4; k++) {
            /* k == 3: only the required keys. */
            char text[512], err[512], path[256];
            int given_required = k < 3 && (d->required & keys[k].key);
            snprintf(text, sizeof(text),
                     "models = ( { name = \"m\"; path = \"p\"; layers = ( { op = \"%s\"; %s%s} ); } );\n",
                     d->name, required, k < 3 && !given_required ? keys[k].text : "");
            struct kcfg *c = load_text(text, NULL, 0, err, sizeof(err), path, sizeof(path));
            int want_ok = k == 3 || (d->keys & keys[k].key);
            if (want_ok && !c) fail_msg("op %s: %s refused: %s", d->name, text, err);
            if (!want_ok && c) fail_msg("op %s: %s accepted", d->name, text);
            if (c) assert_int_equal(c->models[0].layers[0].op, op);
            cfg_destroy(c);
        }
        for (size_t k = 0; k < 3; k++) {
            if (!(d->required & keys[k].key)) continue;
            char text[256], err[512], path[256];
            snprintf(text, sizeof(text),
                     "models = ( { name = \"m\"; path = \"p\"; layers = ( { op = \"%s\"; } ); } );\n",
                     d->name);
            assert_null(load_text(text, NULL, 0, err, sizeof(err), path, sizeof(path)));
            assert_non_null(strstr(err, "needs"));
        }
    }
}

/* cfg_destroy takes NULL, as every destructor does. */
/* encoder.activation: each name is its enum model_scores value; unset
 * is -1 (the folder decides). */
static void test_encoder_activation(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int want;
    } acts[] = {{"softmax", MODEL_SCORES_SOFTMAX},
                {"sigmoid", MODEL_SCORES_SIGMOID},
                {"none", MODEL_SCORES_NONE},
                {NULL, -1}};
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++) {
        char text[256];
        snprintf(text, sizeof(text),
                 "models = ( { name = \"a\"; path = \"p\"; encoder = { %s%s%s }; } );\n",
                 acts[i].name ? "activation = \"" : "", acts[i].name ? acts[i].name : "",
                 acts[i].name ? "\";" : "");
        struct kcfg *c = load_good(text, NULL, 0);
        assert_int_equal(c->n_models, 1);
        assert_int_equal(c->models[0].enc.sigmoid, acts[i].want);
        cfg_destroy(c);
    }
}

static void test_destroy_null(void **state)
{
    (void)state;
    cfg_destroy(NULL);
}

int main(void)
{
    static struct CMUnitTest bad[N_BAD];
    for (size_t i = 0; i < N_BAD; i++) {
        bad[i].name = bad_cases[i].name;
        bad[i].test_func = test_bad;
        bad[i].initial_state = (void *)&bad_cases[i];
    }
    const struct CMUnitTest good[] = {
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_table_sane),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precision_auto),
        cmocka_unit_test(test_all_values),
        cmocka_unit_test(test_set_overrides),
        cmocka_unit_test(test_listen_port_zero),
        cmocka_unit_test(test_set_before_validation),
        cmocka_unit_test(test_relative_paths),
        cmocka_unit_test(test_small_errstr),
        cmocka_unit_test(test_worker_cfg),
        cmocka_unit_test(test_readme_table),
        cmocka_unit_test(test_layer_keys_follow_op_table),
        cmocka_unit_test(test_encoder_activation),
        cmocka_unit_test(test_destroy_null),
    };
    int failed = _cmocka_run_group_tests("config_bad_files", bad, N_BAD, NULL, NULL);
    failed += cmocka_run_group_tests_name("config_good_files", good, NULL, NULL);
    return failed ? 1 : 0;
}
