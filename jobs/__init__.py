"""Spark code only: the Kafka source, the Delta sink and the jobs that derive tables."""
