"""A `kfp.Client` that cannot hang and is not fooled.

kfp.Client sends its requests through one kfp_server_api `ApiClient`, which waits forever for an
answer unless each call passes `_request_timeout` (kfp.Client's methods pass none), and reads any
answer it gets: an HTML login page or another service's JSON becomes an empty result (no pipelines,
no recurring runs) or a crash deep inside kfp. Here that ApiClient gets a timeout on every request,
and every 2xx answer must be the KFP v2beta1 REST API's JSON, of the shape kfp_server_api's model
for it declares, before kfp reads it; anything else raises `NotKFPAnswer`. kfp_remote turns that,
and timeouts, into one clear error.

Imported only by the pipeline commands (it needs kfp).
"""

from __future__ import annotations

import json
from typing import Any

import kfp
import kfp_server_api
import urllib3


# A refused connection is tried once more; a request that got no answer is not sent again (it would
# multiply the wait, and a POST may already have been applied); redirects are followed, so that a
# proxy's login page is seen, and named, as what it is.
_RETRIES = urllib3.Retry(total=None, connect=1, read=0, redirect=5, status=0, other=0)

# KFP names every resource by its id: one without it can be neither used nor listed.
_ID_FIELDS = {"V2beta1Pipeline": "pipeline_id", "V2beta1PipelineVersion": "pipeline_version_id",
              "V2beta1Experiment": "experiment_id", "V2beta1Run": "run_id", "V2beta1RecurringRun": "recurring_run_id"}
# The health answer's fields changed between KFP releases (commit_sha and tag_name went away).
_OPEN_RESPONSES = {"V2beta1GetHealthzResponse"}


class NotKFPAnswer(Exception):
    """A 2xx answer that is not what the KFP v2beta1 REST API sends; `method` tells whether the
    request could have changed anything."""

    def __init__(self, method: str, url: str, got: str):
        super().__init__(f"expected the KFP v2beta1 REST API's JSON at {url}; got {got}")
        self.method = method


def body_snippet(body: str, limit: int = 120) -> str:
    """The start of a response body on one line; an HTML page is named, not dumped."""
    import re

    text = " ".join(body.split())
    if text.lower().startswith(("<!doctype", "<html")) or "<body" in text.lower()[:2000]:
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE)
        return f"an HTML page{f' titled {title.group(1).strip()!r}' if title else ''}"
    return text[:limit] + ("…" if len(text) > limit else "")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def _is_number_text(value: str, kind: type) -> bool:
    try:
        kind(value)
        return True
    except ValueError:
        return False


def shape_problem(value: Any, type_name: str, where: str = "the answer") -> str | None:
    """What makes `value` (parsed JSON) not a `type_name` as kfp_server_api declares it; None if it is one.

    Unknown fields are allowed (a newer KFP may add some), but a non-empty answer (a ...Response)
    must have at least one field of its model, and a resource its id. int64 fields travel as
    strings in KFP's JSON, so numbers and numeric strings stand in for each other.
    """
    if value is None:
        return None  # kfp reads null as absent
    if type_name.startswith("list["):
        if not isinstance(value, list):
            return f"{where} is {_kind(value)} where a list is expected"
        for i, item in enumerate(value):
            problem = shape_problem(item, type_name[5:-1], f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if type_name.startswith("dict(") or type_name == "dict":
        return None if isinstance(value, dict) else f"{where} is {_kind(value)} where an object is expected"
    if type_name == "object":
        return None
    if type_name == "bool":
        return None if isinstance(value, bool) else f"{where} is {_kind(value)} where true or false is expected"
    if type_name in ("int", "float"):
        kind = int if type_name == "int" else float
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and (kind is float or float(value).is_integer())) or (isinstance(value, str) and _is_number_text(value, kind))
        return None if ok else f"{where} is {_kind(value)} where a number is expected"
    if type_name in ("datetime", "date"):
        from dateutil.parser import parse as parse_date

        try:
            parse_date(value)
            return None
        except (TypeError, ValueError, OverflowError):
            return f"{where} is {_kind(value)} where a date is expected"
    if type_name == "str":
        ok = isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
        return None if ok else f"{where} is {_kind(value)} where a string is expected"
    model = getattr(kfp_server_api.models, type_name, None)
    if model is None:
        return None  # a type this check does not know: kfp reads it as it would
    if not model.openapi_types:  # an enum (a run state, a recurring run mode)
        return None if isinstance(value, str) else f"{where} is {_kind(value)} where a name is expected"
    if not isinstance(value, dict):
        return f"{where} is {_kind(value)} where an object is expected"
    fields = {model.attribute_map[attr]: kind for attr, kind in model.openapi_types.items()}
    if value and type_name.endswith("Response") and type_name not in _OPEN_RESPONSES and not fields.keys() & value.keys():
        return f"{where} has none of the fields of a {type_name} ({', '.join(fields)})"
    id_field = _ID_FIELDS.get(type_name)
    if id_field is not None and not (isinstance(value.get(id_field), str) and value[id_field]):
        return f"{where} has no {id_field}"
    prefix = "" if where == "the answer" else f"{where}."
    for key, kind in fields.items():
        problem = shape_problem(value.get(key), kind, prefix + key)
        if problem is not None:
            return problem
    return None


class GuardedApiClient(kfp_server_api.ApiClient):
    """kfp_server_api's ApiClient with a timeout on every request and every answer checked."""

    timeout_s: float  # set by guard(): every answer's longest wait

    def request(self, method, url, *args, _request_timeout=None, **kwargs):
        # (connect, read) seconds: kfp_server_api ignores a lone float
        timeout = _request_timeout or (self.timeout_s, self.timeout_s)
        response = super().request(method, url, *args, _request_timeout=timeout, **kwargs)
        if kwargs.get("_preload_content", True):
            response.kfp_request = (method, url)  # for deserialize's message
            body = response.data.decode("utf-8", errors="replace") if isinstance(response.data, bytes) else str(response.data)
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if not isinstance(doc, dict):  # every KFP answer is a JSON object
                if doc is None:
                    got = f"{response.getheader('content-type') or 'no content type'}: {body_snippet(body) or 'an empty body'}"
                else:
                    got = f"JSON that is not an object: {body_snippet(body)}"
                raise NotKFPAnswer(method, url, got)
        return response

    def deserialize(self, response, response_type):
        if response_type not in (None, "file", "object"):
            problem = shape_problem(json.loads(response.data), response_type)
            if problem is not None:
                method, url = getattr(response, "kfp_request", ("?", "?"))
                raise NotKFPAnswer(method, url, f"JSON of another shape ({problem}): {body_snippet(response.data)}")
        return super().deserialize(response, response_type)


def guard(api_client: kfp_server_api.ApiClient, timeout_s: float) -> GuardedApiClient:
    """Make `api_client` (kfp.Client builds its own and shares it among all its service APIs) a
    GuardedApiClient that waits at most `timeout_s` seconds for each answer."""
    api_client.__class__ = GuardedApiClient
    api_client.timeout_s = timeout_s
    api_client.configuration.retries = _RETRIES
    api_client.rest_client = kfp_server_api.rest.RESTClientObject(api_client.configuration)  # built with the retries
    return api_client


class GuardedClient(kfp.Client):
    """kfp.Client on a GuardedApiClient.

    `health` is the answer of the health check the caller has made already, with a timeout:
    kfp.Client's own check, in its constructor, retries for 25 s and waits forever for each answer.
    """

    def __init__(self, *, health: kfp_server_api.V2beta1GetHealthzResponse, timeout_s: float, **kwargs):
        self._checked_health = health
        super().__init__(**kwargs)
        guard(self._healthz_api.api_client, timeout_s)

    def get_kfp_healthz(self, sleep_duration: int = 5) -> kfp_server_api.V2beta1GetHealthzResponse:
        return self._checked_health
