"""The exception every failed library call raises."""


class Error(RuntimeError):
    """A DataHelix error: ``code`` is the C ABI's ``dh_result`` number, ``name`` its name
    (``"DH_INDEX"``, ``"DH_COLLECTIVE"``, ...), and the message says what went wrong and what to
    do."""

    def __init__(self, message, code, name):
        super().__init__(message, code, name)
        self.message = message
        self.code = code
        self.name = name

    def __str__(self):
        return f"{self.name}: {self.message}"
