"""The library every job shares, one folder per role: source, sink, rules, runtime and the job contract.

`source` reads Kafka and parses its records, `sink` writes the version's Delta tables, `rules` reads
and applies the standardization rules, `runtime` is the job's process (arguments, Spark session,
status file, stop) and `contract` what a pipeline's job gets and gives back, with kappa's runner and
the helpers for a team's tests. A job reads top to bottom as source -> transformation -> sink.
"""
