"""kappa: re-derive a streaming table from a compacted Kafka topic, verify, flip, roll back."""

__version__ = "0.1.0"
