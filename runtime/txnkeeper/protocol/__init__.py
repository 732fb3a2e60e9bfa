"""The client protocol: length-prefixed protobuf frames over TCP, pipelined by request id.

Clients, coordinators and stores all speak it; see ``proto/txnkeeper_api.proto`` for the messages.
"""
