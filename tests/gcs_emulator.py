"""gcp-storage-emulator with GCS's object preconditions, which the emulator ignores.

Run as `python tests/gcs_emulator.py start ARGS` (the emulator's own command line;
tests/gcs_store.py does). Object uploads, reads and deletes that carry `ifGenerationMatch`
get 412 Precondition Failed unless the object's current generation is that number, `0`
meaning "the object does not exist": the semantics GCS documents for its JSON API,
emulated here. The emulator serves one request at a time, so checking the precondition and
then running the handler is atomic, as the real store's precondition is.
"""

from __future__ import annotations

import sys
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def _generation_mismatch(request, storage) -> bool:
    wanted = request.query.get("ifGenerationMatch")
    if not wanted:
        return False
    params = request.params or {}
    name = params.get("object_id") or (request.query.get("name") or [None])[0]
    try:
        current = str(storage.get_file_obj(params["bucket_name"], name)["generation"])
    except NotFound:
        current = "0"
    return current != wanted[0]


def _with_precondition(handler):
    def handle(request, response, storage, *args, **kwargs):
        if _generation_mismatch(request, storage):
            if request.method in ("POST", "PUT"):
                _ = request.data  # read the body before answering
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json({"error": {"code": 412, "message": "conditionNotMet"}})
            return None
        return handler(request, response, storage, *args, **kwargs)

    return handle


def patch_emulator() -> None:
    """Put the precondition check in front of the object upload, get and delete handlers."""
    wrapped = {}
    for name in ("insert", "get", "download", "delete"):
        original = getattr(objects, name)
        wrapped[original] = _with_precondition(original)
        setattr(objects, name, wrapped[original])
    for _regex, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler in wrapped:
                handlers[method] = wrapped[handler]


if __name__ == "__main__":
    patch_emulator()
    main(sys.argv[1:])
