"""Journal records as budgetgen writes them, for tests and benchmarks that build record files by hand."""

from budgetgen.identity import legacy_identity


def stamped(rec, samples=1):
    """rec with the generation identity its params imply (budgetgen.identity.legacy_identity), as every
    record the inference job journals carries one (`identity` right after `id`); a record that has one
    is returned as it is."""
    if rec.get("identity"):
        return rec
    ident = legacy_identity(rec, samples)
    return {"id": rec["id"], "identity": ident.sha, **{k: v for k, v in rec.items() if k != "id"},
            "identity_settings": ident.settings}
