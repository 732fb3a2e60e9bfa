"""Pulsar's payload compression, undone for the data source's rows.

Why: a Pulsar producer with ``compressionType`` set stores its (batched or single) payload compressed,
and the broker never decompresses it: its consumers do. The data source is such a consumer, so it
decompresses with the codecs Pulsar's clients use: LZ4 and Snappy as raw blocks (lz4-java's
``LZ4Compressor``, Snappy's raw format), ZSTD as a standard frame, ZLIB as a zlib stream. The size the
producer declared (``uncompressed_size``) bounds the output, so a damaged payload cannot make a task
allocate without limit, and any mismatch is refused naming the entry, never returned as data.
"""

from __future__ import annotations

import zlib
from typing import Any

from google.protobuf.unknown_fields import UnknownFieldSet

from txnkeeper.pb import PulsarApi_pb2 as pulsar

# Pulsar's client refuses to send more than its max message size (5 MiB by default); a batch may be
# up to the broker's maximum. The data source reads only entries a store accepted (5 MiB frames), so a
# declared size far above that is damage, not data.
MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024
_COMPRESSION_FIELD = pulsar.MessageMetadata.DESCRIPTOR.fields_by_name["compression"].number


class CompressedPayloadError(ValueError):
    """A compressed payload that cannot be undone; the message names the entry and what is wrong."""


def _cramjam() -> Any:
    try:
        import cramjam  # only readers of LZ4, ZSTD or Snappy payloads need it
    except ImportError:
        raise CompressedPayloadError(
            "reading LZ4, ZSTD or Snappy compressed Pulsar messages needs the cramjam package on the "
            "executors: pip install 'txnkeeper[spark-source]'"
        ) from None
    return cramjam


def decompress(payload: bytes, meta: pulsar.MessageMetadata, where: str) -> bytes:
    """The payload as the producer handed it to its compressor."""
    codec = meta.compression
    if codec == pulsar.NONE:
        # proto2 enums are closed: a codec newer than our PulsarApi.proto parses as NONE with its value
        # kept among the unknown fields. Returning that payload would serve compressed bytes as data.
        fields = UnknownFieldSet(meta)
        unknown = [fields[i].data for i in range(len(fields)) if fields[i].field_number == _COMPRESSION_FIELD]
        if unknown:
            raise CompressedPayloadError(
                f"entry {where}: compressed with compression type {unknown[-1]}, which this reader does not "
                "know (a newer Pulsar client?); nothing of it was returned"
            )
        return payload
    name = pulsar.CompressionType.Name(codec)
    size = meta.uncompressed_size
    if not 0 <= size <= MAX_UNCOMPRESSED_BYTES:
        raise CompressedPayloadError(f"entry {where}: declares {size} uncompressed bytes ({name})")
    try:
        if codec == pulsar.ZLIB:
            inflater = zlib.decompressobj()
            out = inflater.decompress(payload, size)
            complete = inflater.eof and not inflater.unconsumed_tail and not inflater.unused_data
        elif codec == pulsar.LZ4:
            out = bytes(_cramjam().lz4.decompress_block(payload, output_len=size))
            complete = True
        elif codec == pulsar.ZSTD:
            out = bytes(_cramjam().zstd.decompress(payload, output_len=size))
            complete = True
        elif codec == pulsar.SNAPPY:
            out = bytes(_cramjam().snappy.decompress_raw(payload, output_len=size))
            complete = True
        else:
            raise CompressedPayloadError(f"entry {where}: unknown compression type {name}")
    except CompressedPayloadError:
        raise
    except Exception as exc:
        raise CompressedPayloadError(
            f"entry {where}: its {name} payload does not decompress: {exc}"
        ) from None
    if not complete or len(out) != size:
        raise CompressedPayloadError(
            f"entry {where}: its {name} payload decompresses to {len(out)} bytes"
            f"{'' if complete else ' or more'}, not the {size} its metadata declares"
        )
    return out
