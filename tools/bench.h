/* bench.h - `kinfer bench`: the load tools and the floors behind `make
 * bench` (bench/run.sh drives them). Each subcommand does one measurement
 * and prints one `name: key=value ...` line on stdout for the script:
 *
 *   produce       open-loop job producer: a fixed offered rate, each
 *                 record's timestamp (and the id) set to its scheduled
 *                 send time, so a slow system cannot slow the load down
 *   collect       waits for a run's results (Redis keyspace events, the
 *                 reply topic, or a key count) and reports latency from
 *                 record timestamp to result, throughput and batching
 *   floor-kafka   raw librdkafka produce, then consume, of the same job
 *                 records, with the worker's client settings
 *   floor-redis   pipelined SET of the same bodies on one connection
 *   passthrough   consume -> produce + pipelined SET, no decode, batch or
 *                 model: the floor kinfer's infrastructure is measured by
 *   gemm          the default model's forward pass alone, rows/s per
 *                 batch size
 *
 * Every subcommand reads the worker's configuration (-c FILE, --set K=V),
 * so the tools see the same brokers, topics, Redis and model as the
 * worker under test.
 *
 * Threads: main thread. */
#ifndef KINFER_BENCH_H
#define KINFER_BENCH_H

/* Runs `kinfer bench SUBCOMMAND [options]`; argv[0] is "bench". Returns
 * the process exit status (0 ok, 1 failure or bad usage). Borrows argv. */
int bench_main(int argc, char **argv);

#endif
