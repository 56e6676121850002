"""Who is asking: the request context built from identity headers.

Both auth strategies end in the same headers (keystonemiddleware sets them
from the validated token; noauth2 derives them from the token text), and the
context is read from those headers in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestContext:
    user_id: str | None = None
    project_id: str | None = None
    roles: list[str] = field(default_factory=list)
    system_scope: str | None = None
    domain_id: str | None = None
    user_domain_id: str | None = None
    project_domain_id: str | None = None
    request_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @classmethod
    def from_environ(cls, environ: dict, request_id: str | None = None) -> "RequestContext":
        def header(name: str) -> str | None:
            value = environ.get("HTTP_" + name)
            return value if value else None

        roles = [r.strip() for r in (header("X_ROLES") or header("X_ROLE") or "").split(",") if r.strip()]
        return cls(
            user_id=header("X_USER_ID") or header("X_USER"),
            project_id=header("X_PROJECT_ID") or header("X_TENANT_ID") or header("X_TENANT"),
            roles=roles,
            system_scope=header("OPENSTACK_SYSTEM_SCOPE"),
            domain_id=header("X_DOMAIN_ID"),
            user_domain_id=header("X_USER_DOMAIN_ID"),
            project_domain_id=header("X_PROJECT_DOMAIN_ID"),
            request_id=request_id,
        )
