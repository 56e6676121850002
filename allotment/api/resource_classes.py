"""``/resource_classes``: list, show, create, rename / ensure, delete (1.2+).

``PUT /resource_classes/{name}`` changed meaning in 1.7: before, it renames
a custom class to the name in the body; from 1.7 it has no body and makes
sure the class named in the URL exists (201 created, 204 already there).
"""

from __future__ import annotations

import webob

from allotment.api.http import Request, json_body, json_response, no_content, require_json_content, validate
from allotment.api.microversion import Versioned
from allotment.db import resource_classes as db
from allotment.db.resource_classes import ResourceClass

# The name pattern and length limit are the contract: clients see the
# python-jsonschema messages quoting them.
NAME = {"type": "string", "pattern": "^CUSTOM_[A-Z0-9_]+$", "maxLength": 255}
RESOURCE_CLASS_SCHEMA = {
    "type": "object",
    "properties": {"name": NAME},
    "required": ["name"],
    "additionalProperties": False,
}
# PUT /resource_classes/{name}: a rename (with a body) until 1.7.
UPDATE_BODY = Versioned({"1.2": RESOURCE_CLASS_SCHEMA, "1.7": None})

# How often a create is re-run after a concurrent creator took our id.
CREATE_RETRIES = 20


def _href(req: Request, name: str) -> str:
    return f"{req.script_name}/resource_classes/{name}"


def _represent(req: Request, rc: ResourceClass) -> dict:
    return {"name": rc.name, "links": [{"rel": "self", "href": _href(req, rc.name)}]}


def _created(req: Request, name: str, status: int = 201) -> webob.Response:
    return no_content(req, status, headers={"Location": _href(req, name)})


def list_resource_classes(req: Request) -> webob.Response:
    with req.app.db.read() as conn:
        classes = db.list_all(conn)
    # The standard classes have no modification time of their own, and they
    # are always in the list: it is "now", as in Placement.
    body = {"resource_classes": [_represent(req, rc) for rc in classes]}
    return json_response(req, body)


def get_resource_class(req: Request) -> webob.Response:
    with req.app.db.read() as conn:
        rc = db.get(conn, req.urlvars["name"])
    return json_response(req, _represent(req, rc), last_modified=rc.last_modified)


def create_resource_class(req: Request) -> webob.Response:
    name = json_body(req)["name"]
    req.app.db.run_write(lambda conn: db.create(conn, name),
                         retry_on=(db.IdTaken,), retries=CREATE_RETRIES)
    return _created(req, name)


def update_resource_class(req: Request) -> webob.Response:
    if req.version >= (1, 7):
        return _ensure_resource_class(req)
    return _rename_resource_class(req)


def _rename_resource_class(req: Request) -> webob.Response:
    require_json_content(req)
    new_name = json_body(req)["name"]
    name = req.urlvars["name"]
    rc = req.app.db.run_write(lambda conn: db.rename(conn, name, new_name),
                              retry_on=(db.IdTaken,), retries=CREATE_RETRIES)
    return json_response(req, _represent(req, rc))


def _ensure_resource_class(req: Request) -> webob.Response:
    name = req.urlvars["name"]
    # The URL's name must pass the body's schema: the same messages result.
    validate({"name": name}, RESOURCE_CLASS_SCHEMA)
    created = req.app.db.run_write(lambda conn: db.ensure(conn, name),
                                   retry_on=(db.IdTaken,), retries=CREATE_RETRIES)
    return _created(req, name, 201 if created else 204)


def delete_resource_class(req: Request) -> webob.Response:
    name = req.urlvars["name"]
    req.app.db.run_write(lambda conn: db.delete(conn, name))
    return no_content(req)
