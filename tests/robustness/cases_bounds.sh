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
