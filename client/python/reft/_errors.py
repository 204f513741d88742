"""The one exception type of the reft client."""


class Error(Exception):
    """A reft failure.

    ``code`` is the agent's error code (``"corrupt"``, ``"not_found"``,
    ``"mismatch"``, ... from docs/PROTOCOL.md) when the agent refused the
    request, and None when the client itself failed or refused.
    """

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self):
        if self.code:
            return "reft agent error %s: %s" % (self.code, self.message)
        return self.message
