"""The version's Delta tables: idempotent writes from foreachBatch, the micro-batch around them, upkeep.

* `tables`: `DeltaTables`, MERGE and append with delta-spark, each commit under Delta's application
  transaction, so a replayed micro-batch is not written twice; the test hooks;
* `batches`: `MicroBatches`, what every job does in foreachBatch around its own transformation;
* `upkeep`: OPTIMIZE, then VACUUM, of the version's tables between micro-batches.
"""
