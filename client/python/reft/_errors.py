"""The one exception type of the reft client."""


class Error(Exception):
    """A reft failure.

    ``code`` is the agent's error code (``"corrupt"``, ``"not_found"``,
    ``"mismatch"``, ... from docs/PROTOCOL.md) when the agent refused the
    request, and None when the client itself failed or refused.

    ``bad_chunks``, with code ``"corrupt"``, lists the corrupt checksum
    chunks as the agent named them: dicts with ``buffer`` (the registered
    buffer; absent for bytes only the agent keeps), ``section``, ``chunk``,
    ``offset`` and ``length`` (bytes of that buffer); empty when the agent
    did not say.
    """

    def __init__(self, message, code=None, bad_chunks=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.bad_chunks = [c for c in bad_chunks if isinstance(c, dict)] \
            if isinstance(bad_chunks, list) else []

    def __str__(self):
        if self.code:
            return "reft agent error %s: %s" % (self.code, self.message)
        return self.message
