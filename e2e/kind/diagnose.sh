#!/usr/bin/env bash
# What the kind cluster and its engine looked like when something went wrong, on stdout: run by
# `make e2e` when the suite fails (before the cluster is deleted) and by up.sh when the API server does
# not answer from this machine. Why: a failed CI run leaves nothing behind but its output, so the
# output must say whether the node container restarted, which control-plane component restarted or
# was OOM-killed, and whether the API server answers through the published port and directly.
#
# Usage: diagnose.sh   (KIND_CLUSTER names the cluster; never fails: every probe is best effort)
set -uo pipefail
# shellcheck source=e2e/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=${KIND_CLUSTER:-txnkeeper-e2e}
NODE=$NAME-control-plane
KUBECONFIG_FILE=$REPO_ROOT/e2e/.state/kind.kubeconfig
KUBECTL=$K8S_BIN/kubectl

section() { printf '\n----- %s -----\n' "$*"; }
bounded() { timeout 20 "$@" 2>&1; }

echo "===== kind diagnostics ($NAME, $(date -u +%FT%TZ)) ====="
if ! DOCKER_HOST=$(bash "$KIND_DIR/engine.sh" host 2>/dev/null); then
    echo "no container engine answers"
    exit 0
fi
export DOCKER_HOST
section "containers"
bounded docker ps -a --format '{{.Names}}\t{{.Status}}\t{{.Ports}}'
section "node container state"
bounded docker inspect -f 'running={{.State.Running}} restarts={{.RestartCount}} oom={{.State.OOMKilled}} exit={{.State.ExitCode}} started={{.State.StartedAt}} finished={{.State.FinishedAt}} error={{.State.Error}} ip={{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$NODE"
section "API server from this machine"
server=$(sed -n 's/^ *server: //p' "$KUBECONFIG_FILE" 2>/dev/null | head -1)
node_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$NODE" 2>/dev/null)
for url in ${server:+$server/readyz} ${node_ip:+https://$node_ip:6443/readyz}; do
    printf '%s: ' "$url"
    curl -sk --max-time 5 -o /dev/null -w '%{http_code}\n' "$url" 2>&1 || echo "curl exit $?"
done
if [[ -n $node_ip ]]; then
    section "this machine's route to the node, and its bridges (a dead one on the same subnet hides it)"
    ip route get "$node_ip" 2>&1 || true
    ip -br link show type bridge 2>&1 || true
fi
env | grep -i '_proxy=' | sed 's/=.*@/=<credentials>@/' || true
if [[ -x $KUBECTL && -f $KUBECONFIG_FILE ]]; then
    section "nodes and kube-system pods"
    bounded "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=10s get nodes -o wide
    bounded "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=10s get pods -n kube-system -o wide
fi
section "inside the node: services, tasks, memory"
bounded docker exec "$NODE" systemctl is-active containerd kubelet
bounded docker exec "$NODE" ctr -n k8s.io tasks ls
bounded docker exec "$NODE" sh -c 'free -m; cat /proc/loadavg'
section "kubelet warnings and errors (last 40)"
bounded docker exec "$NODE" sh -c "journalctl -u kubelet --no-pager -o cat | grep -E '^[EW][0-9]{4}' | tail -n 40 | cut -c1-400"
for component in kube-apiserver etcd; do
    section "$component logs (last 25 lines of each container it ran)"
    bounded docker exec "$NODE" sh -c "for f in /var/log/pods/kube-system_${component}-*/${component}/*.log; do
        echo \"== \$f\"; tail -n 25 \"\$f\" | cut -c1-400; done"
done
section "this machine: memory, load, kernel OOM kills"
free -m
cat /proc/loadavg
dmesg 2>/dev/null | grep -iE 'out of memory|oom-kill|killed process' | tail -10 || true
if [[ -f $CACHE_DIR/docker/dockerd.log ]]; then
    section "dockerd warnings and errors (last 15)"
    grep -v 'level=info' "$CACHE_DIR/docker/dockerd.log" | tail -15 | cut -c1-300
fi
echo "===== end of kind diagnostics ====="
