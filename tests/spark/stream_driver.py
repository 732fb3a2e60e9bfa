"""A streaming query over a txnkeeper topic, run as its own driver process (tests kill it with SIGKILL).

Reads the topic with ``spark.readStream.format("txnkeeper")`` and writes every row to a JSON file sink
with a checkpoint: Spark's offset and commit logs plus the sink's own log are what make a restarted
query resume without duplicates or gaps. Usage: stream_driver.py ADMIN_URL TOPIC CHECKPOINT OUTPUT.
"""

from __future__ import annotations

import sys


def main(admin_url: str, topic: str, checkpoint: str, output: str) -> None:
    from txnkeeper.spark import register
    from txnkeeper.verifier.job import spark_session

    spark = spark_session("local[1]")
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    stream = (
        spark.readStream.format("txnkeeper")
        .option("topic", topic)
        .option("adminUrl", admin_url)
        .load()
        .selectExpr("ledgerId", "entryId", "batchIndex", "CAST(payload AS STRING) AS payload")
    )
    query = (
        stream.writeStream.format("json")
        .option("checkpointLocation", checkpoint)
        .option("path", output)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    print("query started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
