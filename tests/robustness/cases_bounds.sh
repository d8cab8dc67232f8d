# Setups and checks of cases_bounds.tsv (sourced by run_cases.sh): memory, time and numeric
# bounds of options, configs, chat templates and traces.

# A chat template of 110 bytes that doubles a list (it held 2.9 GB after 4 s).
template_doubler() {
  printf '%s' '{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}' \
    >"$W/dbl.jinja"
}
# A membership test over a million items at each of a million iterations (minutes before).
template_quadratic() {
  printf '%s' '{% set l = range(1000000) %}{% for i in l %}{% if -1 in l %}x{% endif %}{% endfor %}' \
    >"$W/slow.jinja"
}

# A memory trace of 1,000,000 events: 20,000 blocks, each in a segment of its own, live to the
# end, then 480,000 blocks allocated and freed 100 apart (memviz took 15 s for 200,000 events and
# did not finish 1,000,000 in 40 s: quadratic in the events and in segments x blocks).
trace_million() {
  awk 'BEGIN {
    printf "{\"device\": \"cpu\", \"events\": ["; t = 0
    for (k = 0; k < 20000; k++) {
      printf "%s{\"kind\":\"segment_alloc\",\"id\":%d,\"size\":4096,\"tag\":\"other\",\"stream\":0,\"t_ns\":%d}", (k ? "," : ""), k, t++
      printf ",{\"kind\":\"alloc\",\"id\":%d,\"size\":4096,\"tag\":\"param\",\"stream\":0,\"t_ns\":%d,\"segment\":%d,\"offset\":0}", k, t++, k
    }
    for (k = 20000; k < 500050; k++) {
      printf ",{\"kind\":\"alloc\",\"id\":%d,\"size\":1024,\"tag\":\"activation\",\"stream\":0,\"t_ns\":%d,\"phase\":\"forward\"}", k, t++
      if (k >= 20100) printf ",{\"kind\":\"free\",\"id\":%d,\"size\":1024,\"tag\":\"activation\",\"stream\":0,\"t_ns\":%d}", k - 100, t++
    }
    print "]}"
  }' >"$W/t.json"
}
check_memviz_million_events() {
  [ -s "$W/t.html" ] || { echo "no page written"; return 1; }
  (( $(echo "$secs < 30" | bc) )) || { echo "took $secs s (linear: a few seconds)"; return 1; }
}

# A config.json whose num_hidden_layers is 10^9 (estimate looped over the layers for minutes).
config_billion_layers() {
  sed 's/"num_hidden_layers": *4/"num_hidden_layers": 1000000000/' \
    "$SRC/data/embedded/config.json" >"$W/config.json"
}
