"""Python code generated from proto/ at build time (``make proto``); never hand-written, never committed.

Importing this package does not import the generated modules, so ``python -m txnkeeper.pb.generate``
can run before they exist.
"""
