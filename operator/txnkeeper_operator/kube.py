"""The operator's Kubernetes I/O: a narrow async interface over the official client.

Reconciliation depends on the `KubeApi` protocol only, so the orchestration can be exercised against an
in-memory cluster in unit tests and against a real API server in e2e. Writes use server-side apply with
one field manager, which makes every write idempotent and leaves fields other writers own (the
verifier's report, kubectl's edits to labels) alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from txnkeeper_operator.naming import API_VERSION, FIELD_MANAGER, GROUP

Obj = dict[str, Any]


class WriteConflict(Exception):
    """A conditional write lost a race (409): someone wrote the object since it was read."""


class KindNotServed(Exception):
    """The API server does not serve the kind (404 on its collection: its CRD is not installed)."""


class KubeApi(Protocol):
    async def apply(self, manifest: Mapping[str, Any]) -> None: ...
    async def create_if_absent(self, manifest: Mapping[str, Any]) -> bool: ...
    async def get(self, kind: str, namespace: str, name: str) -> Obj | None: ...
    async def get_resource(self, plural: str, namespace: str, name: str) -> Obj | None: ...
    async def list_pods(self, namespace: str, selector: str) -> list[Obj]: ...
    async def list_jobs(self, namespace: str, selector: str) -> list[Obj]: ...
    async def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...
    async def patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None: ...
    async def patch_resource(
        self, plural: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> None: ...
    async def list_resources(self, plural: str, namespace: str) -> list[Obj]: ...
    async def patch_secret(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj: ...
    async def apply_custom(self, plural: str, manifest: Mapping[str, Any]) -> None: ...
    async def create_custom_if_absent(self, plural: str, manifest: Mapping[str, Any]) -> bool: ...


class KubernetesClient:
    """`KubeApi` over the `kubernetes` package (its calls block, so each runs in a worker thread)."""

    def __init__(self, api_client: Any | None = None) -> None:
        from kubernetes import client

        self._client = client
        self._api = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self._api)
        self.apps = client.AppsV1Api(self._api)
        self.batch = client.BatchV1Api(self._api)
        self.policy = client.PolicyV1Api(self._api)
        self.rbac = client.RbacAuthorizationV1Api(self._api)
        self.custom = client.CustomObjectsApi(self._api)

    @classmethod
    def from_environment(cls) -> KubernetesClient:
        """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG)."""
        from kubernetes import config as kube_config

        config: Any = kube_config  # the loaders are untyped
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls()

    def _methods(self, kind: str) -> tuple[Any, Any, Any, bool]:
        """(read, patch, create, namespaced) for a kind the operator manages."""
        table: dict[str, tuple[Any, str]] = {
            "ConfigMap": (self.core, "config_map"),
            "Secret": (self.core, "secret"),
            "Service": (self.core, "service"),
            "ServiceAccount": (self.core, "service_account"),
            "Pod": (self.core, "pod"),
            "StatefulSet": (self.apps, "stateful_set"),
            "PodDisruptionBudget": (self.policy, "pod_disruption_budget"),
            "Role": (self.rbac, "role"),
            "RoleBinding": (self.rbac, "role_binding"),
            "Job": (self.batch, "job"),
            "CronJob": (self.batch, "cron_job"),
        }
        api, suffix = table[kind]
        return (
            getattr(api, f"read_namespaced_{suffix}"),
            getattr(api, f"patch_namespaced_{suffix}"),
            getattr(api, f"create_namespaced_{suffix}"),
            True,
        )

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        _read, patch, _create, _ = self._methods(manifest["kind"])
        meta = manifest["metadata"]
        await asyncio.to_thread(
            patch,
            meta["name"],
            meta["namespace"],
            dict(manifest),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    async def create_if_absent(self, manifest: Mapping[str, Any]) -> bool:
        _read, _patch, create, _ = self._methods(manifest["kind"])
        try:
            await asyncio.to_thread(create, manifest["metadata"]["namespace"], dict(manifest))
        except self._client.ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        read, _patch, _create, _ = self._methods(kind)
        try:
            obj = await asyncio.to_thread(read, name, namespace)
        except self._client.ApiException as err:
            if err.status == 404:
                return None
            raise
        result: Obj = self._api.sanitize_for_serialization(obj)
        return result

    async def get_resource(self, plural: str, namespace: str, name: str) -> Obj | None:
        try:
            raw: object = await asyncio.to_thread(
                self.custom.get_namespaced_custom_object, GROUP, API_VERSION, namespace, plural, name
            )
        except self._client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return raw if isinstance(raw, dict) else None

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        pods = await asyncio.to_thread(self.core.list_namespaced_pod, namespace, label_selector=selector)
        return [self._api.sanitize_for_serialization(p) for p in pods.items]

    async def list_jobs(self, namespace: str, selector: str) -> list[Obj]:
        jobs = await asyncio.to_thread(self.batch.list_namespaced_job, namespace, label_selector=selector)
        return [self._api.sanitize_for_serialization(j) for j in jobs.items]

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        # The uid precondition makes a stale decision harmless: it can never delete the pod's successor.
        body = self._client.V1DeleteOptions(preconditions=self._client.V1Preconditions(uid=uid))
        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, name, namespace, body=body)
        except self._client.ApiException as err:
            if err.status not in (404, 409):
                raise

    async def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            API_VERSION,
            namespace,
            plural,
            name,
            {"status": dict(status)},
            # Merge patch: a null removes a field (how a finished downgrade's block is cleared).
            _content_type="application/merge-patch+json",
        )

    async def patch_resource(self, plural: str, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch the custom resource itself (how a done rebalance's annotation is removed)."""
        await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            API_VERSION,
            namespace,
            plural,
            name,
            dict(patch),
            _content_type="application/merge-patch+json",
        )

    async def list_resources(self, plural: str, namespace: str) -> list[Obj]:
        """Every custom resource of ``plural`` (ours) in ``namespace`` (the CA's other users)."""
        raw: object = await asyncio.to_thread(
            self.custom.list_namespaced_custom_object, GROUP, API_VERSION, namespace, plural
        )
        items = raw.get("items") if isinstance(raw, dict) else None
        return [i for i in items or [] if isinstance(i, dict)]

    async def patch_secret(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj:
        """Merge-patch a Secret (a null removes a key); a ``metadata.resourceVersion`` in the patch makes
        it conditional (409 when someone wrote in between). Returns the Secret as written."""
        try:
            obj = await asyncio.to_thread(
                self.core.patch_namespaced_secret,
                name,
                namespace,
                dict(patch),
                _content_type="application/merge-patch+json",
            )
        except self._client.ApiException as err:
            if err.status == 409:
                raise WriteConflict(f"Secret {namespace}/{name} changed while being written") from err
            raise
        result: Obj = self._api.sanitize_for_serialization(obj)
        return result

    @staticmethod
    def _group_version(manifest: Mapping[str, Any]) -> tuple[str, str]:
        group, _, version = str(manifest["apiVersion"]).partition("/")
        return group, version

    async def apply_custom(self, plural: str, manifest: Mapping[str, Any]) -> None:
        """Server-side apply of another project's custom object (cert-manager's Certificate)."""
        group, version = self._group_version(manifest)
        meta = manifest["metadata"]
        try:
            await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object,
                group,
                version,
                meta["namespace"],
                plural,
                meta["name"],
                dict(manifest),
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except self._client.ApiException as err:
            if err.status == 404:
                raise KindNotServed(f"{plural}.{group}/{version} is not served by the API server") from err
            raise

    async def create_custom_if_absent(self, plural: str, manifest: Mapping[str, Any]) -> bool:
        group, version = self._group_version(manifest)
        try:
            await asyncio.to_thread(
                self.custom.create_namespaced_custom_object,
                group,
                version,
                manifest["metadata"]["namespace"],
                plural,
                dict(manifest),
            )
        except self._client.ApiException as err:
            if err.status == 409:
                return False
            raise
        return True
