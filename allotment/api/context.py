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
        # An empty header counts as absent (``or``: the next one, or None).
        header = environ.get
        roles = [r.strip() for r in (header("HTTP_X_ROLES") or header("HTTP_X_ROLE") or "").split(",")
                 if r.strip()]
        return cls(
            user_id=header("HTTP_X_USER_ID") or header("HTTP_X_USER") or None,
            project_id=header("HTTP_X_PROJECT_ID") or header("HTTP_X_TENANT_ID") or header("HTTP_X_TENANT") or None,
            roles=roles,
            system_scope=header("HTTP_OPENSTACK_SYSTEM_SCOPE") or None,
            domain_id=header("HTTP_X_DOMAIN_ID") or None,
            user_domain_id=header("HTTP_X_USER_DOMAIN_ID") or None,
            project_domain_id=header("HTTP_X_PROJECT_DOMAIN_ID") or None,
            request_id=request_id,
        )
