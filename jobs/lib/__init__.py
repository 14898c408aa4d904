"""The runtime library every job shares: Spark session, job process, Kafka source, Delta sink, rules."""
