"""The request parameters that affect content, as journaled with every response and error.

One definition, used by the inference job (each record's `params`), by the budget status (which
permanent errors still hold under the current settings) and at DAG time (rules/common.smk): a
permanent error is tied to the parameters that produced it, so changing a content setting (say a
lower max_tokens after HTTP 400 "max_tokens too large") makes its prompt eligible again.
"""

import hashlib
import json


def request_params(model, max_tokens, temperature=None, top_p=None, extra_body=None):
    """{"model", "max_tokens", "temperature"?, "top_p"?, "extra_body"?}: unset values are left out."""
    p = {"model": model, "max_tokens": int(max_tokens)}
    if temperature is not None:
        p["temperature"] = temperature
    if top_p is not None:
        p["top_p"] = top_p
    if extra_body:
        p["extra_body"] = extra_body
    return p


def params_sha256(params):
    """A stable hash of request parameters (key order and JSON number spelling do not matter)."""
    blob = json.dumps(params or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
