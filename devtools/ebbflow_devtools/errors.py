"""The devtools' error at the cluster boundary: what kubectl, helm, docker or a read from the API
server answered when it failed. Callers see this type, never a client library's exceptions."""


class KindError(RuntimeError):
    """A command or read against the kind cluster failed; the message carries its stderr or answer."""
