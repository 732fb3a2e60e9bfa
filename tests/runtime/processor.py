"""A consume-process-produce application (run as its own process by the exactly-once test).

Each input message is processed in one transaction: produce ``processed:<input>`` to the output topic
and ack the input, then commit; any failure aborts and the input comes back. ``--stall-after N``
makes the instance stop in the middle of its (N+1)th transaction (output produced, input acked, not
committed) and print ``MIDTXN <txn>``; on SIGUSR1 it tries to commit that stale transaction (a
zombie waking up), prints the outcome, and carries on processing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from txnkeeper.client import Client, ServiceError


def say(line: str) -> None:
    print(line, flush=True)


async def process(ns: argparse.Namespace) -> None:
    async with Client(coordinators=[ns.coordinator], stores=[ns.store]) as client:
        consumer = await client.subscribe(ns.input, ns.subscription, receiver_queue_size=1)
        producer = await client.create_producer(ns.output)
        resume = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, resume.set)
        say("STARTED")
        committed = 0
        while True:
            txn = await client.new_transaction(timeout_ms=ns.txn_timeout_ms)
            try:
                message = await consumer.receive()
                await producer.send(b"processed:" + message.data, txn=txn)
                await consumer.acknowledge(message, txn=txn)
                if ns.stall_after is not None and committed == ns.stall_after:
                    ns.stall_after = None
                    say(f"MIDTXN {txn.txn_id.most},{txn.txn_id.least} {message.data.decode()}")
                    await resume.wait()
                    try:
                        await txn.commit()
                        say("ZOMBIE-COMMIT-OK")
                    except ServiceError as exc:
                        say(f"ZOMBIE-COMMIT-FAILED {type(exc).__name__}")
                    continue
                await txn.commit()
                committed += 1
            except ServiceError as exc:
                say(f"TXN-FAILED {type(exc).__name__}: {exc}")
                if txn.state == "OPEN":
                    with contextlib.suppress(ServiceError):
                        await txn.abort()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--subscription", default="processor")
    parser.add_argument("--txn-timeout-ms", type=int, default=2000)
    parser.add_argument("--stall-after", type=int)
    asyncio.run(process(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
