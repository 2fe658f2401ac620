"""The Admin RPCs of tenants, namespaces and grants (docs/SECURITY.md): protobuf to domain
types and back over source/metadata/tenants.py and source/metadata/grants.py. Who may call
them is source/broker/access_rules.py's business, checked before these run."""
from __future__ import annotations

from shadowtopic.core.names import TopicName, check_tenant, parse_namespace
from shadowtopic.core.permissions import check_role, parse_actions, parse_target, sorted_names
from shadowtopic.metadata import grants, tenants
from shadowtopic.metadata.base import MetadataStore
from shadowtopic.pb.v1 import admin_pb2 as apb


def _namespace_of(t: str | TopicName) -> str:
    return t if isinstance(t, str) else t.namespace_name


class AccessAdmin:
    def __init__(self, store: MetadataStore):
        self.store = store

    async def grant(self, request: apb.PermissionRequest) -> None:
        t = parse_target(request.topic)
        role, actions = check_role(request.role), parse_actions(request.actions)
        await tenants.require_namespace(self.store, _namespace_of(t))
        await grants.grant(self.store, t, role, actions)

    async def revoke(self, request: apb.PermissionRequest) -> None:
        t = parse_target(request.topic)
        await tenants.require_namespace(self.store, _namespace_of(t))
        await grants.revoke(self.store, t, check_role(request.role))

    async def permissions(self, request: apb.TopicRequest) -> apb.PermissionsResponse:
        t = parse_target(request.topic)
        await tenants.require_namespace(self.store, _namespace_of(t))
        out = apb.PermissionsResponse()
        for role, actions in sorted((await grants.read(self.store, t)).items()):
            out.roles[role].actions.extend(sorted_names(actions))
        return out

    async def create_tenant(self, request: apb.TenantRequest) -> None:
        await tenants.create_tenant(self.store, check_tenant(request.tenant),
                                    list(request.admin_roles))

    async def delete_tenant(self, request: apb.TenantRequest) -> None:
        await tenants.delete_tenant(self.store, check_tenant(request.tenant))

    async def list_tenants(self) -> apb.ListTenantsResponse:
        found = await tenants.list_tenants(self.store)
        return apb.ListTenantsResponse(tenants=[
            apb.TenantInfo(tenant=name, admin_roles=roles) for name, roles in found.items()])

    async def create_namespace(self, request: apb.NamespaceRequest) -> None:
        await tenants.create_namespace(self.store, parse_namespace(request.namespace))

    async def delete_namespace(self, request: apb.NamespaceRequest) -> None:
        await tenants.delete_namespace(self.store, parse_namespace(request.namespace))

    async def list_namespaces(self, request: apb.ListNamespacesRequest
                              ) -> apb.ListNamespacesResponse:
        names = await tenants.list_namespaces(self.store, check_tenant(request.tenant))
        return apb.ListNamespacesResponse(namespaces=names)
