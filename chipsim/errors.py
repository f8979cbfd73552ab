"""One error type for every bad input: the CLI prints its message on one line and exits non-zero."""


class InputError(Exception):
    """A problem with a user's input (config, trace, command line), stated in one line."""

    def __init__(self, message: str):
        super().__init__(message.replace("\n", " "))
