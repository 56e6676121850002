"""Who is asking: the request context built from identity headers.

Both auth strategies end in the same headers (keystonemiddleware sets them
from the validated token, and removes any the client sent; noauth2 derives
them from the token text), and the context is read from those headers in
one place, as Placement reads them (oslo.context's ``from_environ``): the
first of a value's headers that is present counts, even when empty; roles
are comma-separated; ``X-Is-Admin-Project`` is true unless present and
other than ``true`` (any case).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _first(environ: dict, *keys: str) -> str | None:
    for key in keys:
        value = environ.get(key)
        if value is not None:
            return value
    return None


def _roles(text: str | None) -> list[str]:
    return [role.strip() for role in text.split(",") if role.strip()] if text else []


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
    #: Whether the token's project is the cloud's admin project (keystone's
    #: ``is_admin_project``; true when nobody says, as in oslo.context).
    is_admin_project: bool = True
    #: A service token sent along with the user's (keystone's X-Service-*).
    service_user_id: str | None = None
    service_user_domain_id: str | None = None
    service_project_id: str | None = None
    service_project_domain_id: str | None = None
    service_roles: list[str] = field(default_factory=list)

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @classmethod
    def from_environ(cls, environ: dict, request_id: str | None = None) -> "RequestContext":
        header = environ.get
        admin_project = header("HTTP_X_IS_ADMIN_PROJECT")
        return cls(
            user_id=_first(environ, "HTTP_X_USER_ID", "HTTP_X_USER"),
            project_id=_first(environ, "HTTP_X_PROJECT_ID", "HTTP_X_TENANT_ID", "HTTP_X_TENANT"),
            roles=_roles(_first(environ, "HTTP_X_ROLES", "HTTP_X_ROLE")),
            system_scope=header("HTTP_OPENSTACK_SYSTEM_SCOPE"),
            domain_id=header("HTTP_X_DOMAIN_ID"),
            user_domain_id=header("HTTP_X_USER_DOMAIN_ID"),
            project_domain_id=header("HTTP_X_PROJECT_DOMAIN_ID"),
            request_id=request_id,
            is_admin_project=admin_project is None or admin_project.lower() == "true",
            service_user_id=header("HTTP_X_SERVICE_USER_ID"),
            service_user_domain_id=header("HTTP_X_SERVICE_USER_DOMAIN_ID"),
            service_project_id=header("HTTP_X_SERVICE_PROJECT_ID"),
            service_project_domain_id=header("HTTP_X_SERVICE_PROJECT_DOMAIN_ID"),
            service_roles=_roles(header("HTTP_X_SERVICE_ROLES")),
        )
