"""The whole-proxy benchmark harness (bench/run.py is the entry point). Modules by concern:

- settings: flags and BENCH_* variables -> Settings (bad ones: exit 2)
- rows:     the row table, as data (peer, load, variant)
- tools:    Debian packages, the release build, versions
- procs:    every process started, pinned, and stopped by pid
- peers:    backends and proxies from the templates in bench/peers/
- load:     wrk, h2load and the clients in bench/clients/, one result shape
- measure:  /proc accounting: CPU, RSS, threads, sleeps of a process tree; cpu busy shares
- runner:   one row in one round: the two measuring flows and the failure rules
- report:   medians over rounds, the tables, the JSON
"""
