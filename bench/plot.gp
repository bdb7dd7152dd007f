# plot.gp - latency vs offered load, one pair of curves (p50 dashed, p99
# solid) per batching.max_wait_ms setting. bench/run.sh calls it with
#   gnuplot -e "dir='OUT'; waits='2 10'; out='OUT/bench-latency.png'; sat='4000'" bench/plot.gp
# and reads DIR/lat-wW.dat: load %, offered jobs/s, p50, p90, p99 (ms), mean
# batch rows, batch compute ms, producer lag ms.
set terminal pngcairo size 900,560 font "sans,11" noenhanced
set output out
set title sprintf("kinfer latency vs offered load (MLP 768->3072->768; saturation %s jobs/s)", sat)
set xlabel "offered load, % of saturation"
set ylabel "latency, record timestamp -> result in Redis (ms)"
set logscale y
set grid xtics ytics mytics
set key top left
set xrange [0:100]
set style data linespoints
plot for [i=1:words(waits)] sprintf("%s/lat-w%s.dat", dir, word(waits, i)) \
       using 1:5 lw 2 pt 7 lc i title sprintf("p99, max_wait_ms=%s", word(waits, i)), \
     for [i=1:words(waits)] sprintf("%s/lat-w%s.dat", dir, word(waits, i)) \
       using 1:3 lw 2 pt 6 dt 2 lc i title sprintf("p50, max_wait_ms=%s", word(waits, i))
