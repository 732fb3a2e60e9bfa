"""``kubectl txnkeeper``: a kubectl plugin for the two txnkeeper resources (issue 28, operator controls).

kubectl runs any executable named ``kubectl-<name>`` on PATH as ``kubectl <name>``; the console script
``kubectl-txnkeeper`` is :func:`txnkeeper_operator.kubectl_plugin.cli.main`. It reads and writes only
through the Kubernetes API (the ``kubernetes`` client the operator uses), so it works wherever kubectl
does: a kubeconfig (--kubeconfig, $KUBECONFIG, --context, -n) or, inside a pod, the in-cluster account.
Modules: ``cli`` (arguments, exit codes), ``refs`` (kubectl-style resource names), ``connect`` (client
and namespace), ``failures`` (API errors as sentences), ``views`` (pure text rendering), ``actions``
(what verify/pause/resume change), ``certs`` (certificate expiry).
"""
