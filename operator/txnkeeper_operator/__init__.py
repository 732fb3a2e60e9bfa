"""The txnkeeper Kopf operator: reconciles TransactionCoordinator and PendingAckStore resources.

It never imports the runtime package; it talks to pods only through their admin API and to everything
else through the Kubernetes API.
"""
